"""Self-serve over REST: what a tenant admin does on the pages (pages/manage.py), for a tenant key
the operators marked ``self_serve`` (in the admin: API keys > self serve). Each view calls the
same service with ``acting=`` (control/self_serve.py), which checks the tenant's switch, the
hidden actions, the tenant and the ceiling, and audits the key. Alert subscriptions are the
alerts routes (a tenant key manages its own endpoints there, docs/api.md#alerts)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import generics, serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from llm_budgets.api import serializers as s
from llm_budgets.api.exceptions import HttpError
from llm_budgets.api.killswitches import actor_of
from llm_budgets.api.schema import api_schema
from llm_budgets.api.scoping import api_key_of, tenant_for
from llm_budgets.api.views import ApiView, Pagination, errors
from llm_budgets.control.api_keys import api_key_create, api_key_revoke
from llm_budgets.control.limits import budget_remove, budget_set_limit
from llm_budgets.control.raises import budget_raise_grant, budget_raise_revoke
from llm_budgets.control.self_serve import SELF_SERVE_SCOPES, TenantAdmin, raise_target
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.engine.adjustments import end_user_spend_reset
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import ApiKey, Budget, BudgetRaise, EndUser
from llm_budgets.windows import Window


class IsSelfServeKey(BasePermission):
    message = (
        "This endpoint needs a tenant key with the self_serve scope; the operators grant it "
        "on the key (operator keys use /budgets)."
    )
    code = "self_serve_key_required"

    def has_permission(self, request: Request, view: Any) -> bool:
        key = request.auth
        return isinstance(key, ApiKey) and key.tenant_id is not None and key.self_serve


def acting_of(request: Request) -> TenantAdmin:
    key = api_key_of(request)
    assert key.tenant is not None, "IsSelfServeKey runs first"
    return TenantAdmin(tenant=key.tenant, person=actor_of(key))


class SelfServeView(ApiView):
    permission_classes = [IsSelfServeKey]


def not_found(message: str) -> HttpError:
    """Another tenant's id answers as an unknown one does (404 not_found)."""
    return HttpError(message, code="not_found", status_code=status.HTTP_404_NOT_FOUND)


def _own(model: Any, pk: object, **lookup: Any) -> Any:
    row = model.objects.filter(pk=pk, **lookup).first()
    if row is None:
        raise not_found(f"No {model._meta.verbose_name} {pk!r} in this tenant.")
    return row


class SelfServeBudgetRequestSerializer(s.StrictSerializer):
    end_user = s.IdentifierField(required=False, max_length=255, help_text='"*" for each user.')
    api_key = serializers.CharField(
        required=False, max_length=255, help_text='One of the tenant\'s key prefixes, or "*".'
    )
    run = s.IdentifierField(required=False, max_length=255, help_text='A run id, or "*".')
    tag = serializers.ListField(
        child=serializers.CharField(max_length=256), min_length=2, max_length=2, required=False
    )
    window = serializers.ChoiceField(choices=Window.choices)
    amount = s.MoneyField()
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class ReasonSerializer(s.StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class RaiseRequestSerializer(s.StrictSerializer):
    end_user = s.IdentifierField(max_length=255)
    window = serializers.ChoiceField(choices=Window.choices)
    amount = s.MoneyField()
    until = serializers.DateTimeField(help_text="When the raise ends (timezone-aware).")
    reason = serializers.CharField(max_length=500)


class RaiseSerializer(serializers.ModelSerializer[BudgetRaise]):
    amount = s.money_out()

    class Meta:
        model = BudgetRaise
        fields = ["id", "budget", "amount", "starts_at", "ends_at", "reason", "granted_by"]


class ResetRequestSerializer(s.StrictSerializer):
    end_user = s.IdentifierField(max_length=255)
    reason = serializers.CharField(max_length=500)


class ResetSerializer(serializers.Serializer):
    lines = serializers.IntegerField(help_text="Adjustment ledger lines written.")


class KeyRequestSerializer(s.StrictSerializer):
    name = serializers.CharField(max_length=50)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class KeySerializer(serializers.Serializer):
    prefix = serializers.CharField()
    name = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
    key = serializers.CharField(help_text="<prefix>.<secret>: in this answer only.")


class SelfServeBudgetsView(SelfServeView, generics.ListAPIView[Budget]):
    serializer_class = s.BudgetSerializer
    pagination_class = Pagination
    query_parameters = frozenset({"limit", "offset"})

    def get_queryset(self) -> QuerySet[Budget]:
        return (
            Budget.objects.filter(tenant=acting_of(self.request).tenant)
            .filter(scope__in=SELF_SERVE_SCOPES)
            .select_related("tenant", "end_user", "api_key", "run")
            .order_by("pk")
        )

    @api_schema(
        operation_id="self_serve_budgets_list",
        summary="The tenant's budgets a self-serve key may change",
        responses={200: s.BudgetSerializer(many=True), **errors(403)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with ledger_guard("read"):
            return super().get(request, *args, **kwargs)

    @api_schema(
        operation_id="self_serve_budgets_set",
        summary="Set a budget of one of the tenant's users, keys, runs or tags (within the "
        "ceiling; audited)",
        request=SelfServeBudgetRequestSerializer,
        responses={200: s.BudgetSerializer, **errors(403)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(SelfServeBudgetRequestSerializer, request)
        acting = acting_of(request)
        with ledger_guard("limits"):
            budget = budget_set_limit(
                tenant=tenant_for(request, None).external_id,
                amount=data["amount"],
                window=data["window"],
                end_user=data.get("end_user"),
                api_key=data.get("api_key"),
                run=data.get("run"),
                tag=tuple(data["tag"]) if "tag" in data else None,
                reason=data["reason"],
                acting=acting,
            )
        return Response(s.BudgetSerializer(budget).data)


class SelfServeBudgetRemoveView(SelfServeView):
    @api_schema(
        operation_id="self_serve_budgets_remove",
        summary="Remove a budget of one of the tenant's users, keys, runs or tags (audited)",
        request=ReasonSerializer,
        responses={204: None, **errors(403, 404)},
    )
    def post(self, request: Request, budget_id: int) -> Response:
        data = self.valid(ReasonSerializer, request)
        acting = acting_of(request)
        budget = _own(Budget, budget_id, tenant=acting.tenant, scope__in=SELF_SERVE_SCOPES)
        with ledger_guard("limits"):
            budget_remove(budget, reason=data["reason"], acting=acting)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SelfServeRaisesView(SelfServeView):
    @api_schema(
        operation_id="self_serve_raises_grant",
        summary="Grant one of the tenant's users a temporary raise on their own budget",
        request=RaiseRequestSerializer,
        responses={201: RaiseSerializer, **errors(403)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(RaiseRequestSerializer, request)
        acting = acting_of(request)
        budget = raise_target(acting.tenant, data["end_user"], data["window"])
        if budget is None:
            raise InvalidUsage(
                f"{data['end_user']} has no {data['window']} budget of their own to raise: set "
                "one first (POST self-serve/budgets).",
                field="end_user",
            )
        with ledger_guard("limits"):
            raise_ = budget_raise_grant(
                budget=budget,
                amount=data["amount"],
                until=data["until"],
                reason=data["reason"],
                acting=acting,
            )
        return Response(RaiseSerializer(raise_).data, status=status.HTTP_201_CREATED)


class SelfServeRaiseRevokeView(SelfServeView):
    @api_schema(
        operation_id="self_serve_raises_revoke",
        summary="End a raise of one of the tenant's users now",
        request=ReasonSerializer,
        responses={200: RaiseSerializer, **errors(403, 404)},
    )
    def post(self, request: Request, raise_id: int) -> Response:
        data = self.valid(ReasonSerializer, request)
        acting = acting_of(request)
        raise_ = _own(BudgetRaise, raise_id, budget__tenant=acting.tenant)
        with ledger_guard("limits"):
            ended = budget_raise_revoke(raise_, reason=data["reason"], acting=acting)
        return Response(RaiseSerializer(ended).data)


class SelfServeResetView(SelfServeView):
    @api_schema(
        operation_id="self_serve_end_users_reset",
        summary="Reset one of the tenant's users' spend this period (audited)",
        request=ResetRequestSerializer,
        responses={200: ResetSerializer, **errors(403, 404)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(ResetRequestSerializer, request)
        acting = acting_of(request)
        user = EndUser.objects.filter(tenant=acting.tenant, external_id=data["end_user"]).first()
        if user is None:
            raise not_found(f"No end user {data['end_user']!r} in this tenant.")
        with ledger_guard("adjustments"):
            lines = end_user_spend_reset(end_user=user, reason=data["reason"], acting=acting)
        return Response({"lines": len(lines)})


class SelfServeKeysView(SelfServeView):
    @api_schema(
        operation_id="self_serve_api_keys_create",
        summary="Create a key of the tenant (never self-serve); the key is in this answer only",
        request=KeyRequestSerializer,
        responses={201: KeySerializer, **errors(403)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(KeyRequestSerializer, request)
        acting = acting_of(request)
        with ledger_guard("api keys"):
            key, secret = api_key_create(
                tenant=acting.tenant.external_id,
                name=data["name"],
                expires_at=data["expires_at"],
                acting=acting,
            )
        body = {"prefix": key.prefix, "name": key.name, "expires_at": key.expiry_date}
        return Response({**body, "key": secret}, status=status.HTTP_201_CREATED)


class SelfServeKeyRevokeView(SelfServeView):
    @api_schema(
        operation_id="self_serve_api_keys_revoke",
        summary="Revoke one of the tenant's keys for good (audited)",
        request=ReasonSerializer,
        responses={204: None, **errors(403, 404)},
    )
    def post(self, request: Request, prefix: str) -> Response:
        data = self.valid(ReasonSerializer, request)
        acting = acting_of(request)
        key = ApiKey.objects.filter(prefix=prefix, tenant=acting.tenant).first()
        if key is None:
            raise not_found(f"No API key {prefix!r} in this tenant.")
        with ledger_guard("api keys"):
            api_key_revoke(key, reason=data["reason"], acting=acting)
        return Response(status=status.HTTP_204_NO_CONTENT)
