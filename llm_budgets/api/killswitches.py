"""Kill switch endpoints (operator keys): list, trip and clear. Thin views over
:mod:`llm_budgets.control.killswitches`, which audits each action, sends the signal and emails
operators, exactly as for a trip or clear in the admin."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from llm_budgets.api.idempotency import idempotent
from llm_budgets.api.permissions import IsOperatorKey
from llm_budgets.api.schema import api_schema
from llm_budgets.api.scoping import api_key_of, query_id
from llm_budgets.api.serializers import IdentifierField, StrictSerializer, idempotency_key_field
from llm_budgets.api.views import IDEMPOTENCY_HEADER, ApiView, Pagination, errors
from llm_budgets.control.killswitches import (
    kill_switch_clear,
    kill_switch_trip,
    kill_switches_in_state,
    switch_is_open,
    switch_scope,
)
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.models import ApiKey, KillSwitch

STATES = ("open", "cleared")


def actor_of(key: ApiKey) -> str:
    """Who acted, for the audit log and the refusals a switch causes."""
    return f"api-key:{key.prefix} ({key.name})"


class IsOperatorKeyForSwitches(IsOperatorKey):
    message = "Kill switches need an operator API key; tenant keys cannot see or change them."


class KillSwitchSerializer(serializers.ModelSerializer[KillSwitch]):
    scope = serializers.CharField(
        source="scope_label", read_only=True, help_text='"global", or e.g. "tenant acme, model m".'
    )
    tenant = serializers.CharField(
        source="tenant.external_id", read_only=True, allow_null=True, default=None
    )
    end_user = serializers.CharField(
        source="end_user.external_id", read_only=True, allow_null=True, default=None
    )
    api_key = serializers.CharField(
        source="api_key.prefix",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The prefix of the API key it is limited to, if any.",
    )
    run = serializers.CharField(
        source="run.external_id",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The run it is limited to, if any.",
    )
    active = serializers.SerializerMethodField(help_text="Refusing admissions now.")

    class Meta:
        model = KillSwitch
        fields = [
            "id",
            "scope",
            "tenant",
            "end_user",
            "provider",
            "model",
            "api_key",
            "run",
            "active",
            "reason",
            "tripped_by",
            "tripped_at",
            "automatic",
            "detector",
            "auto_clear_at",
            "cleared_at",
            "cleared_by",
            "clear_reason",
        ]
        read_only_fields = fields

    def get_active(self, obj: KillSwitch) -> bool:
        return switch_is_open(obj, timezone.now())


def _scope_field(help_text: str, max_length: int = 255) -> serializers.CharField:
    return IdentifierField(
        required=False, allow_null=True, max_length=max_length, help_text=help_text
    )


class SwitchScopeSerializer(StrictSerializer):
    """No scope field: global. Several: their intersection."""

    tenant = _scope_field("The tenant's external id.")
    end_user = _scope_field("An end user's external id (needs tenant).")
    provider = _scope_field("A provider.", 64)
    model = _scope_field("A model.", 128)
    api_key = _scope_field("The prefix of a REST API key: only calls made through it.", 8)
    run = _scope_field("A run id (needs tenant): only calls naming that run.")
    reason = serializers.CharField(
        max_length=2000, help_text="Required: shown to whoever is refused, and audited."
    )
    idempotency_key = idempotency_key_field()

    def scope_kwargs(self) -> dict[str, Any]:
        data = self.validated_data
        scope = ("tenant", "end_user", "provider", "model", "api_key", "run")
        return {k: data.get(k) for k in scope}


class TripRequestSerializer(SwitchScopeSerializer):
    auto_clear_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="Reopen by itself at this time. Empty: stays until a person clears it.",
    )


class KillSwitchListView(ApiView, generics.ListAPIView[KillSwitch]):
    permission_classes = [IsOperatorKeyForSwitches]
    query_parameters = frozenset({"state", "tenant", "limit", "offset"})
    serializer_class = KillSwitchSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[KillSwitch]:
        state = self.request.query_params.get("state") or None
        if state is not None and state not in STATES:
            raise serializers.ValidationError({"state": [f"Must be one of {', '.join(STATES)}."]})
        switches = kill_switches_in_state(state, timezone.now()).select_related("end_user__tenant")
        tenant = query_id(self.request, "tenant")
        if tenant is not None:
            switches = switches.filter(tenant__external_id=tenant)
        return switches

    @api_schema(
        operation_id="kill_switches_list",
        summary="Kill switches, newest first (operator keys)",
        parameters=[
            OpenApiParameter(
                "state",
                OpenApiTypes.STR,
                enum=list(STATES),
                description="open: refusing now; cleared: cleared or past auto_clear_at. "
                "Omit for both.",
            ),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="Only this tenant's."),
        ],
        responses={200: KillSwitchSerializer(many=True), **errors(403)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)

    @api_schema(
        operation_id="kill_switches_trip",
        summary="Trip a kill switch: refuse every admission in a scope now (operator keys; "
        "audited)",
        request=TripRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            201: KillSwitchSerializer,
            200: KillSwitchSerializer,
            **errors(403, 404, 409),
        },
        description="201 with the new switch; 200 with the open one, unchanged, when the scope "
        "is already tripped (its first reason stands).",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        serializer = TripRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        now = timezone.now()
        with ledger_guard("kill switch trip"):
            scope = switch_scope(**serializer.scope_kwargs())
            assert scope is not None  # end users are created on trip
            switch = kill_switch_trip(
                scope=scope,
                reason=serializer.validated_data["reason"],
                actor=actor_of(api_key_of(request)),
                auto_clear_at=serializer.validated_data.get("auto_clear_at"),
                now=now,
            )
        created = switch.tripped_at == now
        return Response(
            KillSwitchSerializer(switch).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class KillSwitchClearView(ApiView):
    permission_classes = [IsOperatorKeyForSwitches]

    @api_schema(
        operation_id="kill_switches_clear",
        summary="Clear the kill switch tripped on exactly this scope (operator keys; audited)",
        request=SwitchScopeSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: KillSwitchSerializer, **errors(403, 404, 409)},
        description="400 (field scope) when no switch is tripped on exactly that scope.",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        serializer = SwitchScopeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with ledger_guard("kill switch clear"):
            scope = switch_scope(**serializer.scope_kwargs(), create_end_user=False)
            switch = kill_switch_clear(
                scope=scope,
                reason=serializer.validated_data["reason"],
                actor=actor_of(api_key_of(request)),
            )
        return Response(KillSwitchSerializer(switch).data)
