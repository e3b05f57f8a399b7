"""Alert endpoints, their deliveries and the events (docs/alerts.md) over REST. Thin views over
:mod:`llm_budgets.alerts.endpoints`, which validates, audits and writes.

An operator key manages the installation-wide endpoints and may act on any tenant's; a tenant
key sees and changes its own tenant's only: another tenant's endpoint or delivery is a 404, as
if it did not exist. A webhook's signing secret is in the answer to a create or a rotation and
never again (those two operations refuse an Idempotency-Key: a stored replay would keep the
secret in the database).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from llm_budgets.alerts.bodies import TYPES
from llm_budgets.alerts.endpoints import (
    DeliveryNotFound,
    EndpointNotFound,
    delivery_get,
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_disable,
    endpoint_enable,
    endpoint_get,
    endpoint_secret_rotate,
    endpoint_test_send,
    endpoint_update,
)
from llm_budgets.api.exceptions import HttpError
from llm_budgets.api.idempotency import HEADER, idempotent
from llm_budgets.api.killswitches import actor_of
from llm_budgets.api.schema import api_schema
from llm_budgets.api.scoping import api_key_of, query_id, tenant_for
from llm_budgets.api.serializers import StrictSerializer, idempotency_key_field
from llm_budgets.api.views import IDEMPOTENCY_HEADER, ApiView, Pagination, errors
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.models import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    EndpointKind,
    Tenant,
)

TENANT_TYPES = [name for name, schema in TYPES.items() if schema.tenant_visible]


def _no_idempotency_key(request: Request) -> None:
    """Create and rotate refuse the header rather than ignore it: a retry would not be safe."""
    if request.headers.get(HEADER) is not None:
        raise ValidationError(
            {
                HEADER: [
                    "This operation takes no Idempotency-Key: its answer holds a signing secret, "
                    "which is never stored for a replay. Send it without the header."
                ]
            }
        )


def _confirm_site(request: Request) -> str | None:
    """Where a tenant key's email addresses are sent their confirmation links: this app as the
    request reached it. None for an operator key: the operators vouch for what they add."""
    return None if api_key_of(request).tenant is None else request.build_absolute_uri("/")


def _owner(request: Request) -> Tenant | None:
    """Whose endpoints the key may see: its tenant's, or (operator key) everyone's."""
    return api_key_of(request).tenant


def _endpoint(request: Request, endpoint_id: str) -> AlertEndpoint:
    try:
        with ledger_guard("read"):
            return endpoint_get(endpoint_id, tenant=_owner(request))
    except EndpointNotFound as exc:
        raise HttpError(
            f"{exc} It does not exist or belongs to another tenant.",
            code="alert_endpoint_not_found",
            status_code=status.HTTP_404_NOT_FOUND,
        ) from None


def _delivery(request: Request, delivery_id: str) -> AlertDelivery:
    """The delivery by the id receivers see (``dlv_...``), scoped by ``delivery_get``."""
    try:
        with ledger_guard("read"):
            pk = AlertDelivery.objects.filter(uid=delivery_id).values_list("pk", flat=True).first()
            if pk is None:
                raise DeliveryNotFound(delivery_id)
            return delivery_get(pk, tenant=_owner(request))
    except DeliveryNotFound as exc:
        raise HttpError(
            f"{exc} It does not exist or belongs to another tenant.",
            code="alert_delivery_not_found",
            status_code=status.HTTP_404_NOT_FOUND,
        ) from None


def _tenant_param(request: Request, queryset: QuerySet[Any], field: str) -> QuerySet[Any]:
    """``?tenant=`` for an operator key: one tenant's rows (``-``: the installation-wide ones).
    A tenant key sees its own only, whatever it names (another tenant: 404)."""
    key = api_key_of(request)
    if key.tenant is not None:
        tenant_for(request, query_id(request, "tenant"))  # another tenant named: 404
        return queryset.filter(**{field: key.tenant})
    if request.query_params.get("tenant") == "-":
        return queryset.filter(**{f"{field}__isnull": True})
    named = query_id(request, "tenant")
    return queryset if named is None else queryset.filter(**{f"{field}__external_id": named})


TENANT_PARAMETER = OpenApiParameter(
    "tenant",
    OpenApiTypes.STR,
    description="Operator keys: only this tenant's (`-`: only the installation-wide ones). "
    "A tenant key sees its own only.",
)


class AlertEndpointSerializer(serializers.ModelSerializer[AlertEndpoint]):
    tenant = serializers.CharField(
        source="tenant.external_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The tenant's external id; null: installation-wide (operators).",
    )
    secret_hint = serializers.CharField(
        read_only=True,
        help_text='The signing secret\'s last characters ("…a1b2"), to tell secrets apart; "" '
        "for kinds without one. The secret itself is shown once, on create and rotate.",
    )
    event_types = serializers.ListField(child=serializers.CharField(), read_only=True)
    unconfirmed_emails = serializers.SerializerMethodField(
        help_text="Email addresses a tenant added that have not followed the confirmation link "
        "they were sent (valid ALERTS_EMAIL_CONFIRM_SECONDS, 24 h): nothing is sent to them. "
        "Sending the target again sends a new link to any whose link expired."
    )

    def get_unconfirmed_emails(self, endpoint: AlertEndpoint) -> list[str]:
        return sorted(endpoint.unconfirmed_emails or {})

    class Meta:
        model = AlertEndpoint
        fields = [
            "id",
            "tenant",
            "kind",
            "target",
            "event_types",
            "description",
            "contact_emails",
            "unconfirmed_emails",
            "secret_hint",
            "enabled",
            "disabled_reason",
            "disabled_at",
            "consecutive_failures",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class EndpointWithSecretSerializer(AlertEndpointSerializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="The webhook signing secret: store it now, it is not shown again ("
        '"" for Slack, Teams and email endpoints).',
    )

    class Meta(AlertEndpointSerializer.Meta):
        fields = [*AlertEndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields


def _with_secret(endpoint: AlertEndpoint, secret: str) -> dict[str, Any]:
    data = dict(AlertEndpointSerializer(endpoint).data)
    data["secret"] = secret
    return data


def _event_types_field(required: bool) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(),
        required=required,
        help_text=f"The event types it receives, at least one of: {', '.join(TYPES)}.",
    )


class EndpointCreateSerializer(StrictSerializer):
    tenant = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="The tenant whose events it receives. Tenant keys: their own (may be "
        "omitted). Operator keys: omit for an installation-wide endpoint (every event).",
    )
    kind = serializers.ChoiceField(
        choices=EndpointKind.choices,
        error_messages={"invalid_choice": f"Must be one of {', '.join(EndpointKind.values)}."},
    )
    target = serializers.CharField(
        max_length=2000,
        help_text="The https:// URL (webhook, Slack, Teams) or comma-separated email addresses. "
        "A tenant key's email addresses are each sent a confirmation link first: the endpoint "
        "waits disabled until one is followed.",
    )
    event_types = _event_types_field(required=True)
    description = serializers.CharField(required=False, allow_blank=True, max_length=255)
    contact_emails = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="Told when the endpoint is disabled after repeated failures; empty: the "
        "tenant's billing contacts (installation-wide: the operators).",
    )


class EndpointUpdateSerializer(StrictSerializer):
    """Only what is sent changes. The kind and the tenant never change: create another."""

    not_yet = {
        "kind": "The kind cannot change: create another endpoint.",
        "tenant": "The tenant cannot change: create another endpoint.",
        "enabled": "Use POST .../disable (with a reason) or POST .../enable.",
        "secret": "Use POST .../rotate-secret.",
    }

    target = serializers.CharField(max_length=2000, required=False)
    event_types = _event_types_field(required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=255)
    contact_emails = serializers.CharField(required=False, allow_blank=True)


class RotateSerializer(StrictSerializer):
    overlap_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="How long the old secret stays valid beside the new one (each delivery is "
        "signed with both meanwhile). Default: ALERTS_SECRET_OVERLAP_SECONDS; 0: at once; at "
        "most ALERTS_SECRET_OVERLAP_MAX_SECONDS (7 days by default).",
    )


class DisableSerializer(StrictSerializer):
    reason = serializers.CharField(
        max_length=255, help_text="Required: why (audited, shown in the admin)."
    )
    idempotency_key = idempotency_key_field()


class EmptySerializer(StrictSerializer):
    idempotency_key = idempotency_key_field()


class AlertEventSerializer(serializers.ModelSerializer[AlertEvent]):
    id = serializers.CharField(source="uid", read_only=True, help_text="The event id (evt_...).")
    tenant = serializers.CharField(
        source="tenant.external_id", read_only=True, allow_null=True, default=None
    )
    body = serializers.JSONField(read_only=True, help_text="Its type's body (docs/alerts.md).")

    class Meta:
        model = AlertEvent
        fields = ["id", "type", "version", "tenant", "body", "created_at"]
        read_only_fields = fields


class AlertDeliverySerializer(serializers.ModelSerializer[AlertDelivery]):
    id = serializers.CharField(
        source="uid", read_only=True, help_text="The delivery id receivers deduplicate on."
    )
    event = serializers.CharField(source="event.uid", read_only=True)
    event_type = serializers.CharField(source="event.type", read_only=True)
    endpoint = serializers.IntegerField(source="endpoint_id", read_only=True)

    class Meta:
        model = AlertDelivery
        fields = [
            "id",
            "event",
            "event_type",
            "endpoint",
            "state",
            "attempts",
            "next_attempt_at",
            "first_attempt_at",
            "last_attempt_at",
            "last_status_code",
            "last_error",
            "delivered_at",
            "created_at",
        ]
        read_only_fields = fields


class AlertEndpointListView(ApiView, generics.ListAPIView[AlertEndpoint]):
    query_parameters = frozenset({"tenant", "limit", "offset"})
    serializer_class = AlertEndpointSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[AlertEndpoint]:
        endpoints = AlertEndpoint.objects.select_related("tenant").order_by("pk")
        return _tenant_param(self.request, endpoints, "tenant")

    @api_schema(
        operation_id="alert_endpoints_list",
        summary="Alert endpoints (a tenant key: its own)",
        parameters=[TENANT_PARAMETER],
        responses={200: AlertEndpointSerializer(many=True), **errors(404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)

    @api_schema(
        operation_id="alert_endpoints_create",
        summary="Create an alert endpoint; a webhook's signing secret is in this answer only",
        request=EndpointCreateSerializer,
        responses={201: EndpointWithSecretSerializer, **errors(404)},
        description="An Idempotency-Key header is refused (400): the answer holds the secret, "
        "which is never stored for a replay. A retried create makes a second endpoint; delete "
        "the spare one.",
    )
    def post(self, request: Request) -> Response:
        _no_idempotency_key(request)
        data = self.valid(EndpointCreateSerializer, request)
        key = api_key_of(request)
        named = data.get("tenant")
        # An operator key naming no tenant makes an installation-wide endpoint.
        tenant = tenant_for(request, named) if key.tenant is not None or named else None
        with ledger_guard("alert endpoint create"):
            endpoint, secret = endpoint_create(
                tenant=tenant,
                kind=data["kind"],
                target=data["target"],
                event_types=data["event_types"],
                description=data.get("description", ""),
                contact_emails=data.get("contact_emails", ""),
                actor=actor_of(key),
                confirm_site=_confirm_site(request),
            )
        return Response(_with_secret(endpoint, secret), status=status.HTTP_201_CREATED)


class AlertEndpointDetailView(ApiView):
    @api_schema(
        operation_id="alert_endpoints_retrieve",
        summary="An alert endpoint (never its secret)",
        responses={200: AlertEndpointSerializer, **errors(404)},
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(AlertEndpointSerializer(_endpoint(request, endpoint_id)).data)

    @api_schema(
        operation_id="alert_endpoints_update",
        summary="Change an alert endpoint's target, event types, description or contacts",
        request=EndpointUpdateSerializer,
        responses={200: AlertEndpointSerializer, **errors(404)},
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        data = self.valid(EndpointUpdateSerializer, request)
        endpoint = _endpoint(request, endpoint_id)
        with ledger_guard("alert endpoint update"):
            endpoint_update(
                endpoint,
                **data,
                actor=actor_of(api_key_of(request)),
                confirm_site=_confirm_site(request),
            )
        return Response(AlertEndpointSerializer(endpoint).data)

    @api_schema(
        operation_id="alert_endpoints_destroy",
        summary="Delete an alert endpoint and its deliveries (the events stay; audited)",
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        with ledger_guard("alert endpoint delete"):
            endpoint_delete(endpoint, actor=actor_of(api_key_of(request)))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AlertEndpointRotateView(ApiView):
    @api_schema(
        operation_id="alert_endpoints_rotate_secret",
        summary="A new signing secret for a webhook endpoint, in this answer only",
        request=RotateSerializer,
        responses={200: EndpointWithSecretSerializer, **errors(404)},
        description="The old secret stays valid for `overlap_seconds`. 400 (field kind) for "
        "Slack, Teams and email endpoints, which have no secret. An Idempotency-Key is "
        "refused (see create).",
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        _no_idempotency_key(request)
        data = self.valid(RotateSerializer, request)
        endpoint = _endpoint(request, endpoint_id)
        with ledger_guard("alert endpoint rotate"):
            secret = endpoint_secret_rotate(
                endpoint,
                actor=actor_of(api_key_of(request)),
                overlap_seconds=data.get("overlap_seconds"),
            )
        return Response(_with_secret(endpoint, secret))


class AlertEndpointTestView(ApiView):
    @api_schema(
        operation_id="alert_endpoints_test",
        summary="Queue an alert.test event for this endpoint alone",
        request=EmptySerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={202: AlertEventSerializer, **errors(404)},
        description="Sent by the delivery job like any event (a disabled endpoint gets it once "
        "enabled): follow it with GET /alerts/deliveries?event=<id>.",
    )
    @idempotent
    def post(self, request: Request, endpoint_id: str) -> Response:
        self.valid(EmptySerializer, request)
        endpoint = _endpoint(request, endpoint_id)
        with ledger_guard("alert endpoint test"):
            event = endpoint_test_send(endpoint, actor=actor_of(api_key_of(request)))
        return Response(AlertEventSerializer(event).data, status=status.HTTP_202_ACCEPTED)


class _EndpointStateView(ApiView):
    """POST .../{action}: a service call on an endpoint the key may see; answers with it."""

    request_serializer: type[serializers.Serializer] = EmptySerializer

    def act(self, endpoint: AlertEndpoint, data: dict[str, Any], actor: str) -> None:
        raise NotImplementedError

    def run(self, request: Request, endpoint_id: str) -> Response:
        data = self.valid(self.request_serializer, request)
        endpoint = _endpoint(request, endpoint_id)
        with ledger_guard(f"alert endpoint {type(self).__name__}"):
            self.act(endpoint, data, actor_of(api_key_of(request)))
        return Response(AlertEndpointSerializer(endpoint).data)


class AlertEndpointDisableView(_EndpointStateView):
    request_serializer = DisableSerializer

    @api_schema(
        operation_id="alert_endpoints_disable",
        summary="Stop sending to an endpoint; its deliveries wait (audited)",
        request=DisableSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: AlertEndpointSerializer, **errors(404)},
    )
    @idempotent
    def post(self, request: Request, endpoint_id: str) -> Response:
        return self.run(request, endpoint_id)

    def act(self, endpoint: AlertEndpoint, data: dict[str, Any], actor: str) -> None:
        endpoint_disable(endpoint, reason=data["reason"], actor=actor)


class AlertEndpointEnableView(_EndpointStateView):
    @api_schema(
        operation_id="alert_endpoints_enable",
        summary="Send to an endpoint again, its waiting deliveries first (audited)",
        request=EmptySerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: AlertEndpointSerializer, **errors(404)},
    )
    @idempotent
    def post(self, request: Request, endpoint_id: str) -> Response:
        return self.run(request, endpoint_id)

    def act(self, endpoint: AlertEndpoint, data: dict[str, Any], actor: str) -> None:
        endpoint_enable(endpoint, actor=actor)


class AlertDeliveryListView(ApiView, generics.ListAPIView[AlertDelivery]):
    query_parameters = frozenset({"tenant", "endpoint", "event", "state", "limit", "offset"})
    serializer_class = AlertDeliverySerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[AlertDelivery]:
        params = self.request.query_params
        deliveries = AlertDelivery.objects.select_related("event").order_by("-pk")
        deliveries = _tenant_param(self.request, deliveries, "endpoint__tenant")
        state = params.get("state") or None
        if state is not None:
            if state not in AlertDeliveryState.values:
                raise ValidationError(
                    {"state": [f"Must be one of {', '.join(AlertDeliveryState.values)}."]}
                )
            deliveries = deliveries.filter(state=state)
        endpoint = params.get("endpoint") or None
        if endpoint is not None:
            if not endpoint.isascii() or not endpoint.isdigit():
                raise ValidationError({"endpoint": ["Must be an endpoint id (a whole number)."]})
            deliveries = deliveries.filter(endpoint_id=int(endpoint))
        event = query_id(self.request, "event")
        if event is not None:
            deliveries = deliveries.filter(event__uid=event)
        return deliveries

    @api_schema(
        operation_id="alert_deliveries_list",
        summary="The delivery log, newest first (a tenant key: its endpoints' only)",
        parameters=[
            TENANT_PARAMETER,
            OpenApiParameter("endpoint", OpenApiTypes.INT, description="Only this endpoint's."),
            OpenApiParameter("event", OpenApiTypes.STR, description="Only this event's (evt_...)."),
            OpenApiParameter(
                "state", OpenApiTypes.STR, enum=list(AlertDeliveryState.values), description=""
            ),
        ],
        responses={200: AlertDeliverySerializer(many=True), **errors(404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)


class AlertDeliveryDetailView(ApiView):
    @api_schema(
        operation_id="alert_deliveries_retrieve",
        summary="One delivery: its state, attempts, last status code and error",
        responses={200: AlertDeliverySerializer, **errors(404)},
    )
    def get(self, request: Request, delivery_id: str) -> Response:
        return Response(AlertDeliverySerializer(_delivery(request, delivery_id)).data)


class AlertDeliveryRedeliverView(ApiView):
    @api_schema(
        operation_id="alert_deliveries_redeliver",
        summary="Send a delivery again, with the same delivery id, due now (audited)",
        request=EmptySerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={202: AlertDeliverySerializer, **errors(404)},
        description="Back in its endpoint's queue in the pending state; the receiver can "
        "recognise a copy it stored by the delivery id.",
    )
    @idempotent
    def post(self, request: Request, delivery_id: str) -> Response:
        self.valid(EmptySerializer, request)
        delivery = _delivery(request, delivery_id)
        with ledger_guard("alert delivery redeliver"):
            delivery = delivery_redeliver(delivery, actor=actor_of(api_key_of(request)))
        return Response(AlertDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class AlertEventListView(ApiView, generics.ListAPIView[AlertEvent]):
    query_parameters = frozenset({"tenant", "type", "limit", "offset"})
    serializer_class = AlertEventSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[AlertEvent]:
        events = AlertEvent.objects.select_related("tenant").order_by("-pk")
        events = _tenant_param(self.request, events, "tenant")
        if api_key_of(self.request).tenant is not None:
            # Operators-only types (a parked Stripe delivery) stay with the operators.
            events = events.filter(type__in=TENANT_TYPES)
        event_type = self.request.query_params.get("type") or None
        if event_type is not None:
            if event_type not in TYPES:
                raise ValidationError({"type": [f"Must be one of {', '.join(TYPES)}."]})
            events = events.filter(type=event_type)
        return events

    @api_schema(
        operation_id="alert_events_list",
        summary="Alert events, newest first (a tenant key: its own tenant's)",
        parameters=[
            TENANT_PARAMETER,
            OpenApiParameter("type", OpenApiTypes.STR, enum=list(TYPES), description=""),
        ],
        responses={200: AlertEventSerializer(many=True), **errors(404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)
