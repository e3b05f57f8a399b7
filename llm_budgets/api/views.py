"""REST endpoints. Each one: authenticate the key, check the body's shape, scope to what the key
may see, call one service, serialize. Errors are rendered by :mod:`llm_budgets.api.exceptions`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from llm_budgets import validation
from llm_budgets.api import serializers as s
from llm_budgets.api.authentication import ApiKeyAuthentication
from llm_budgets.api.exceptions import HttpError, exception_handler
from llm_budgets.api.idempotency import HEADER, idempotent, key_of
from llm_budgets.api.parsers import BoundedJSONParser
from llm_budgets.api.permissions import HasApiKey, IsOperatorKey
from llm_budgets.api.schema import AppAutoSchema, api_schema
from llm_budgets.api.scoping import (
    api_key_of,
    query_id,
    reservation_for,
    reservation_id_for,
    tenant_for,
)
from llm_budgets.api.throttling import ApiKeyRateThrottle
from llm_budgets.control import limits
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.engine import admission, settlement
from llm_budgets.engine.applicable import scopes_for_read
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import Budget, EndUser, Price, Reservation
from llm_budgets.reads import quotes
from llm_budgets.reads.statuses import budget_statuses, tenant_visible
from llm_budgets.tenancy.runs import run_close

ERROR_TEXT = {
    400: "Invalid request: every bad field is named in `error.fields`.",
    401: "No API key, or an invalid, revoked or expired one.",
    403: "The key may not do this (operator key required), or a kill switch is active.",
    404: "No such object, or it belongs to another tenant.",
    409: "Conflicting state, or an Idempotency-Key reused for another request or still running.",
    422: "Cannot be priced or capped (unknown price, missing output ceiling, no budget), or a "
    "commit's usage beyond its hold (usage_exceeds_hold).",
    429: "A budget would be exceeded (`error.budget`), or the key is throttled. See Retry-After.",
    501: "Not available in this version.",
    503: "A dependency is unavailable (the ledger's database; Stripe, for a top-up). A write "
    "whose answer was lost may have been applied: retry the same request (settlements are "
    "idempotent; a reservation with the same Idempotency-Key). See Retry-After.",
}


def errors(*codes: int, refusal: bool = False) -> dict[int, OpenApiResponse]:
    """The error responses of an operation. Every operation can answer 400, 401, 429 (throttle)
    and 503; ``refusal`` documents the budget refusal shape for 429."""
    result = {}
    for code in sorted({400, 401, 429, 503, *codes}):
        body = s.BudgetExceededSerializer if code == 429 and refusal else s.ErrorSerializer
        result[code] = OpenApiResponse(body, description=ERROR_TEXT[code])
    return result


IDEMPOTENCY_HEADER = OpenApiParameter(
    HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Makes the POST safe to retry: a replay returns the first response "
    "(with `Idempotent-Replayed: true`); the same key with another body is a 409.",
)


# Every answer of the API: a tenant's figures, a secret shown once, a refusal and its
# Retry-After are never kept by a browser or a shared cache, nor served from one again.
CACHE_CONTROL = "no-store"


class NoStore:
    """``Cache-Control: no-store`` on every response of a DRF view, errors included (they pass
    through ``finalize_response`` too)."""

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(  # type: ignore[misc]
            request, response, *args, **kwargs
        )
        response["Cache-Control"] = CACHE_CONTROL
        return response


def no_store(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """The same for a plain Django view mounted beside the API (the Stripe webhook)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        response["Cache-Control"] = CACHE_CONTROL
        return response

    return wrapper


class ApiView(NoStore, APIView):
    # Settings of every llm_budgets endpoint, set here rather than in the host's REST_FRAMEWORK.

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [HasApiKey]
    throttle_classes = [ApiKeyRateThrottle]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]
    schema = AppAutoSchema()
    # The query parameters a GET understands; any other is a 400 naming it (a parameter that was
    # silently ignored, such as ?tenant= with a tenant key, would look like it had been obeyed).
    query_parameters: frozenset[str] = frozenset()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication, permissions, throttles
        allowed = self.query_parameters if request.method in ("GET", "HEAD") else frozenset()
        unknown = sorted(set(request.query_params) - allowed)
        if unknown:
            raise ValidationError(
                {
                    name: [
                        "Unknown query parameter"
                        + (
                            f"; this operation takes {', '.join(sorted(allowed))}."
                            if allowed
                            else "; this operation takes none."
                        )
                    ]
                    for name in unknown
                }
            )

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        return exception_handler

    def valid(
        self, serializer_class: type[Serializer], request: Request, *, query: bool = False
    ) -> dict[str, Any]:
        serializer = s.validating(serializer_class, request.query_params if query else request.data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)


class ReservationCreateView(ApiView):
    @api_schema(
        operation_id="reservations_create",
        summary="Reserve: admit a call and hold its worst-case cost",
        request=s.ReserveRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            201: s.ReservationSerializer,
            **errors(403, 404, 409, 422, refusal=True),
        },
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.valid(s.ReserveRequestSerializer, request)
        tenant = tenant_for(request, data.get("tenant"))
        call = s.call_request(data, tenant=tenant.external_id, idempotency_key=key_of(request))
        reservation = admission.reservation_admit(call, api_key=api_key_of(request))
        return Response(
            s.represent(s.ReservationSerializer, reservation), status=status.HTTP_201_CREATED
        )


class ReservationDetailView(ApiView):
    @api_schema(
        operation_id="reservations_retrieve",
        summary="A reservation",
        responses={200: s.ReservationSerializer, **errors(404)},
    )
    def get(self, request: Request, reservation_id: str) -> Response:
        return Response(
            s.represent(s.ReservationSerializer, reservation_for(request, reservation_id))
        )


class ReservationCommitView(ApiView):
    # Authentication's one statement also reads whether the key may see this reservation.
    prefetch_reservation = "reservation_id"

    @api_schema(
        operation_id="reservations_commit",
        summary="Commit actual usage (repeating returns the first result)",
        request=s.CommitRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.CommitResultSerializer, **errors(404, 409, 422)},
    )
    @idempotent
    def post(self, request: Request, reservation_id: str) -> Response:
        data = self.valid(s.CommitRequestSerializer, request)
        rid = reservation_id_for(request, reservation_id)
        data.pop("idempotency_key", None)
        result = settlement.reservation_commit(rid, **data)
        return Response(s.represent(s.CommitResultSerializer, result))


class _ReservationActionView(ApiView):
    """POST .../{action}: run a service on a reservation the key may see, answer with it."""

    request_serializer: type[Serializer] = s.EmptyRequestSerializer

    def act(self, reservation: Reservation, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def run(self, request: Request, reservation_id: str) -> Response:
        data = self.valid(self.request_serializer, request)
        reservation = reservation_for(request, reservation_id)
        self.act(reservation, data)
        with ledger_guard("read"):
            # Re-read with its relations: the serializer must not query outside the guard.
            reservation = Reservation.objects.select_related("tenant", "end_user").get(
                pk=reservation.pk
            )
        return Response(s.represent(s.ReservationSerializer, reservation))


class ReservationReleaseView(_ReservationActionView):
    @api_schema(
        operation_id="reservations_release",
        summary="Release the hold: the call produced nothing",
        request=s.EmptyRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.ReservationSerializer, **errors(404, 409)},
    )
    @idempotent
    def post(self, request: Request, reservation_id: str) -> Response:
        return self.run(request, reservation_id)

    def act(self, reservation: Reservation, data: dict[str, Any]) -> None:
        settlement.reservation_release(reservation.pk)


class ReservationExtendView(_ReservationActionView):
    request_serializer = s.ExtendRequestSerializer

    @api_schema(
        operation_id="reservations_extend",
        summary="Push a held reservation's expiry later",
        request=s.ExtendRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.ReservationSerializer, **errors(404, 409)},
    )
    @idempotent
    def post(self, request: Request, reservation_id: str) -> Response:
        return self.run(request, reservation_id)

    def act(self, reservation: Reservation, data: dict[str, Any]) -> None:
        settlement.reservation_extend(reservation.pk, ttl=data["ttl_seconds"])


class ReservationUncertainView(_ReservationActionView):
    @api_schema(
        operation_id="reservations_uncertain",
        summary="Mark uncertain: the call may have run (timeout, lost worker)",
        request=s.EmptyRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.ReservationSerializer, **errors(404, 409)},
    )
    @idempotent
    def post(self, request: Request, reservation_id: str) -> Response:
        return self.run(request, reservation_id)

    def act(self, reservation: Reservation, data: dict[str, Any]) -> None:
        settlement.reservation_mark_uncertain(reservation.pk)


class TenantStatusView(ApiView):
    query_parameters = frozenset({"end_user", "run", "tags"})

    @api_schema(
        operation_id="tenants_status",
        summary="Every budget that applies to the tenant (or one of its end users), now",
        parameters=[
            OpenApiParameter(
                "end_user", OpenApiTypes.STR, description="Include this end user's budgets."
            ),
            OpenApiParameter("run", OpenApiTypes.STR, description="Include this run's budgets."),
            OpenApiParameter(
                "tags",
                OpenApiTypes.STR,
                description='Include these tags\' budgets: JSON text, e.g. {"project": "alpha"}.',
            ),
        ],
        responses={200: s.TenantStatusSerializer, **errors(404)},
    )
    def get(self, request: Request, external_id: str) -> Response:
        tenant = tenant_for(request, external_id)
        end_user_id = query_id(request, "end_user")
        with ledger_guard("status"):
            end_user = None
            if end_user_id is not None:
                # Not seen yet: show the defaults it would get, without creating it.
                end_user = tenant.end_users.filter(external_id=end_user_id).first() or EndUser(
                    tenant=tenant, external_id=end_user_id
                )
            scopes = scopes_for_read(
                tenant, run=query_id(request, "run"), tags=_query_tags(request)
            )
            statuses = budget_statuses(tenant, end_user, timezone.now(), scopes)
        if not api_key_of(request).is_operator:
            statuses = tenant_visible(statuses)
        body = {"tenant": tenant.external_id, "end_user": end_user_id, "budgets": statuses}
        return Response(s.TenantStatusSerializer(body).data)


class RunCloseView(ApiView):
    @api_schema(
        operation_id="runs_close",
        summary="Close a run: its lifetime budgets end and later reservations naming it are "
        "refused (audited)",
        request=s.RunCloseRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.RunSerializer, **errors(404, 409)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.valid(s.RunCloseRequestSerializer, request)
        tenant = tenant_for(request, data.get("tenant"))
        key = api_key_of(request)
        with ledger_guard("runs"):
            run = run_close(
                tenant=tenant.external_id,
                run=data["run"],
                actor=f"api key {key.prefix} ({key.name})",
                reason=data["reason"],
            )
        return Response(s.RunSerializer(run).data)


def _query_tags(request: Request) -> object:
    """The ``tags`` query parameter: JSON text of an object (checked by ``tags_validate``)."""
    text = request.query_params.get("tags")
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidUsage(
            'tags must be a JSON object sent as text, e.g. {"project": "alpha"}.', field="tags"
        ) from None


class QuoteView(ApiView):
    query_parameters = frozenset(s.QuoteQuerySerializer().fields)

    @api_schema(
        operation_id="quote",
        summary="Explain a price: the itemised worst case and the budgets it would draw on "
        "(holds nothing)",
        parameters=[s.QuoteQuerySerializer],
        responses={200: s.QuoteSerializer, **errors(404, 422)},
    )
    def get(self, request: Request) -> Response:
        data = self.valid(s.QuoteQuerySerializer, request, query=True)
        tenant = tenant_for(request, data.get("tenant"))
        quote = quotes.request_quote(
            s.call_request(data, tenant=tenant.external_id), api_key=api_key_of(request)
        )
        if not api_key_of(request).is_operator:
            quote = quotes.for_tenant(quote)
        body = {"tenant": tenant.external_id, "end_user": data.get("end_user"), **vars(quote)}
        return Response(s.QuoteSerializer({**body, "admissible": quote.admissible}).data)


class Pagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000
    max_offset = 10**9  # beyond this an OFFSET overflows some databases; nothing is there anyway

    def get_limit(self, request: Request) -> int | None:
        value = self._number(request, self.limit_query_param, minimum=1)
        if value is not None and value > self.max_limit:
            raise ValidationError({self.limit_query_param: [f"Must be at most {self.max_limit}."]})
        return self.default_limit if value is None else value

    def get_offset(self, request: Request) -> int:
        value = self._number(request, self.offset_query_param, minimum=0)
        return 0 if value is None else min(value, self.max_offset)

    @staticmethod
    def _number(request: Request, name: str, *, minimum: int) -> int | None:
        """The parameter as a whole number, or None when absent. ``abc``, ``-1`` or ``null`` is
        a 400 naming it, not a silent fallback to the default."""
        raw = request.query_params.get(name)
        if raw is None:
            return None
        try:
            value = validation.whole_number(name, raw)
        except InvalidUsage as exc:
            raise ValidationError({name: [exc.message]}) from None
        if value < minimum:
            raise ValidationError({name: [f"Must be at least {minimum}."]})
        return value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, self.max_limit), self.offset_query_param: (0, None)}
        for parameter in parameters:
            low, high = bounds.get(parameter["name"], (None, None))
            if low is not None:
                parameter["schema"]["minimum"] = low
            if high is not None:
                parameter["schema"]["maximum"] = high
        return parameters


class PriceListView(ApiView, generics.ListAPIView[Price]):
    serializer_class = s.PriceSerializer
    pagination_class = Pagination
    query_parameters = frozenset({"provider", "model", "limit", "offset"})

    def get_queryset(self) -> QuerySet[Price]:
        prices = Price.objects.all()
        for name in ("provider", "model"):
            value = query_id(self.request, name)
            if value is not None:
                prices = prices.filter(**{name: value})
        return prices

    @api_schema(
        operation_id="prices_list",
        summary="Price versions (every key may read them)",
        parameters=[
            OpenApiParameter("provider", OpenApiTypes.STR),
            OpenApiParameter("model", OpenApiTypes.STR),
        ],
        responses={200: s.PriceSerializer(many=True), **errors()},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)


class BudgetListView(ApiView, generics.ListAPIView[Budget]):
    permission_classes = [IsOperatorKey]
    serializer_class = s.BudgetSerializer
    pagination_class = Pagination
    query_parameters = frozenset({"tenant", "limit", "offset"})

    def get_queryset(self) -> QuerySet[Budget]:
        budgets = Budget.objects.select_related("tenant", "end_user", "api_key", "run")
        tenant = query_id(self.request, "tenant")
        if tenant is not None:
            budgets = budgets.filter(tenant__external_id=tenant)
        return budgets

    @api_schema(
        operation_id="budgets_list",
        summary="Budgets (operator keys)",
        parameters=[OpenApiParameter("tenant", OpenApiTypes.STR, description="Only this tenant.")],
        responses={200: s.BudgetSerializer(many=True), **errors(403)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)

    @api_schema(
        operation_id="budgets_set_limit",
        summary="Create or change a budget's limit (operator keys; audited)",
        request=s.SetLimitRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.BudgetSerializer, **errors(403, 404, 409)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.valid(s.SetLimitRequestSerializer, request)
        key = api_key_of(request)
        with ledger_guard("limits"):
            budget = limits.budget_set_limit(
                amount=data["amount"],
                window=data["window"],
                tenant=data.get("tenant"),
                end_user=data.get("end_user"),
                api_key=data.get("api_key"),
                run=data.get("run"),
                tag=tuple(data["tag"]) if "tag" in data else None,
                hot=data.get("hot"),
                stripes=data.get("stripes"),
                actor=f"api key {key.prefix} ({key.name})",
                reason=data["reason"],
            )
        return Response(s.BudgetSerializer(budget).data)


class NotFoundView(ApiView):
    """Any other path under the API: a JSON 404, not the host's HTML page."""

    permission_classes: list[Any] = []
    authentication_classes: list[Any] = []

    @api_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raise HttpError(
            f"No endpoint at {request.path}.",
            code="not_found",
            status_code=status.HTTP_404_NOT_FOUND,
        )

    post = put = patch = delete = get
