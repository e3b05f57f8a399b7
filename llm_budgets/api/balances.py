"""Prepaid balances over REST: ``GET tenants/<id>/balance`` (where it stands, its lots, its
top-ups, its auto-recharge rule) and ``POST tenants/<id>/top-ups`` (a Stripe Checkout session to
pay into it). A tenant's key sees and tops up only its own tenant. Thin: ``billing/credits.py``
and ``billing/topups.py`` do the work."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from llm_budgets.api.idempotency import idempotent
from llm_budgets.api.killswitches import actor_of
from llm_budgets.api.schema import api_schema
from llm_budgets.api.scoping import api_key_of, tenant_for
from llm_budgets.api.serializers import MoneyField, StrictSerializer, money_out
from llm_budgets.api.views import IDEMPOTENCY_HEADER, ApiView, errors
from llm_budgets.billing.credits import account_of, balance_state
from llm_budgets.billing.topups import top_up_checkout
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.models import CreditLot, TopUp

# The most recent lots and top-ups a balance answer lists.
HISTORY = 50


class LotSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    kind = serializers.CharField(read_only=True, help_text="paid or promotional")
    origin = serializers.CharField(
        source="source", read_only=True, help_text="top_up, recharge, grant, adjustment"
    )
    amount = money_out()
    forfeited = money_out(
        help_text="Expired unspent, taken back by a refund or dispute, or removed by staff."
    )
    taken_back = money_out(help_text="The part of forfeited a refund or dispute took back.")
    expires_at = serializers.DateTimeField(read_only=True, allow_null=True)
    expired_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)


class TopUpSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    kind = serializers.CharField(read_only=True, help_text="checkout or recharge")
    state = serializers.CharField(read_only=True, help_text="pending, credited, failed, skipped")
    amount = money_out()
    currency = serializers.CharField(read_only=True)
    package = serializers.CharField(read_only=True)
    refunded = money_out(help_text="Refunded to the payer (Stripe's cumulative figure).")
    disputed = money_out(help_text="Withdrawn by the payment's dispute while open or lost.")
    dispute_status = serializers.CharField(read_only=True, help_text="'', open, won or lost")
    unrecovered = money_out(
        help_text="Gone back to the payer but no longer in its lot to take (expired or removed)."
    )
    created_at = serializers.DateTimeField(read_only=True)
    credited_at = serializers.DateTimeField(read_only=True, allow_null=True)


class RechargeSerializer(serializers.Serializer):
    below = money_out(allow_null=True)
    amount = money_out(allow_null=True)
    daily_max = money_out(allow_null=True)
    armed = serializers.BooleanField(read_only=True)


class BalanceSerializer(serializers.Serializer):
    tenant = serializers.CharField(read_only=True)
    currency = serializers.CharField(read_only=True)
    credit = money_out(help_text="The balance's limit: the live parts of its lots.")
    spent = money_out()
    held = money_out(help_text="Worst cases of calls in flight.")
    available = money_out(
        help_text="What new calls may still hold: credit - spent - held, at least 0."
    )
    debt = money_out(
        help_text="Spent beyond the credit (an expiry or a refund or dispute of spent or held "
        "credit, a call's overage): the next top-up pays it first. 0 without debt."
    )
    top_up_url = serializers.CharField(read_only=True)
    auto_recharge = RechargeSerializer(read_only=True)
    lots = LotSerializer(many=True, read_only=True)
    top_ups = TopUpSerializer(many=True, read_only=True)


class TopUpRequestSerializer(StrictSerializer):
    amount = MoneyField(
        required=False,
        help_text="Give amount or package. A decimal string (or an integer), never a float nor "
        "an exponent; at most PREPAID_TOP_UP_MAX (10000 by default).",
    )
    package = serializers.CharField(required=False, max_length=64, help_text="PREPAID_PACKAGES")
    success_url = serializers.URLField(max_length=2000)
    cancel_url = serializers.URLField(max_length=2000)


class CheckoutSerializer(serializers.Serializer):
    top_up = TopUpSerializer(read_only=True)
    checkout_url = serializers.CharField(read_only=True, help_text="Send the payer here.")
    session_id = serializers.CharField(read_only=True)


def balance_body(tenant: Any) -> dict[str, Any]:
    account = account_of(tenant)
    state = balance_state(account)
    return {
        "tenant": account.tenant.external_id,
        "currency": state.currency,
        "credit": state.credit,
        "spent": state.spent,
        "held": state.held,
        "available": state.available,
        "debt": state.debt,
        "top_up_url": account.top_up_url,
        "auto_recharge": {
            "below": account.recharge_below,
            "amount": account.recharge_amount,
            "daily_max": account.recharge_daily_max,
            "armed": account.recharge_armed,
        },
        "lots": CreditLot.objects.filter(account=account).order_by("-created_at", "-pk")[:HISTORY],
        "top_ups": TopUp.objects.filter(account=account).order_by("-created_at", "-pk")[:HISTORY],
    }


class TenantBalanceView(ApiView):
    @api_schema(
        operation_id="tenants_balance",
        summary="The tenant's prepaid balance: credit, spent, held, available, lots and top-ups",
        responses={200: BalanceSerializer, **errors(404)},
        description="400 `no_balance` when the tenant's spending is not prepaid.",
    )
    def get(self, request: Request, external_id: str) -> Response:
        tenant = tenant_for(request, external_id)
        with ledger_guard("read"):
            return Response(BalanceSerializer(balance_body(tenant)).data)


class TenantTopUpView(ApiView):
    @api_schema(
        operation_id="tenants_top_up",
        summary="Start a top-up: a Stripe Checkout session for an amount or a package",
        request=TopUpRequestSerializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: CheckoutSerializer, **errors(404, 409)},
        description="The balance is credited when Stripe reports the payment (webhook), once. "
        "400 `not_linked` without a Stripe customer; 503 `payment_provider_error` with "
        "`Retry-After` when Stripe failed or could not be reached (nothing was charged).",
    )
    @idempotent
    def post(self, request: Request, external_id: str) -> Response:
        data = self.valid(TopUpRequestSerializer, request)
        tenant = tenant_for(request, external_id)
        with ledger_guard("top-up"):
            started = top_up_checkout(
                tenant=tenant.external_id,
                amount=data.get("amount"),
                package=data.get("package"),
                success_url=data["success_url"],
                cancel_url=data["cancel_url"],
                actor=actor_of(api_key_of(request)),
            )
        body = {
            "top_up": started.top_up,
            "checkout_url": started.url,
            "session_id": started.session_id,
        }
        return Response(CheckoutSerializer(body).data, status=201)
