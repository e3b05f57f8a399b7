"""``GET tenants/<id>/usage``: the tenant pages' figures for hosts that draw their own pages.

Live (``reads.live``: the daily rollups plus the ledger lines since their watermark), grouped by
day, model or end user, over a range of the tenant's local days (default: its current billing
period). Tenant keys see only their own tenant; the budgets themselves are
``GET tenants/<id>/status``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from llm_budgets.api.schema import api_schema
from llm_budgets.api.scoping import tenant_for
from llm_budgets.api.serializers import StrictSerializer, money_out
from llm_budgets.api.views import ApiView, Pagination, errors
from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.money import ZERO, round_charge
from llm_budgets.reads import live, usage
from llm_budgets.validation import identifier


class UsageQuerySerializer(StrictSerializer):
    group_by = serializers.ChoiceField(
        choices=list(usage.GROUPS), default="day", help_text="How rows are grouped."
    )
    start = serializers.DateField(
        required=False, help_text="First local day (tenant's timezone); default: period start."
    )
    end = serializers.DateField(
        required=False, help_text="Last local day, inclusive; default: the period's last day."
    )
    end_user = serializers.CharField(
        required=False, max_length=255, help_text="Only this end user's usage."
    )
    limit = serializers.IntegerField(required=False, min_value=1, help_text="Rows per page.")
    offset = serializers.IntegerField(required=False, min_value=0, help_text="Rows to skip.")

    def validate_end_user(self, value: str) -> str:
        return identifier("end_user", value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("start"), attrs.get("end")
        if start and end and end < start:
            raise serializers.ValidationError(
                {"end": [f"end ({end}) is before start ({start}): give the last day."]}
            )
        return attrs


class UsageRowSerializer(serializers.Serializer):
    # Output only, yet not read_only: a read-only field is a required property of the response
    # schema, and a row carries only the fields of its grouping.
    day = serializers.DateField(required=False, help_text="group_by=day.")
    provider = serializers.CharField(required=False, help_text="group_by=model.")
    model = serializers.CharField(required=False, help_text="group_by=model.")
    end_user = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="group_by=end_user; null for calls without an end user.",
    )
    amount = money_out(help_text="Spend in `unit`.")
    calls = serializers.IntegerField(read_only=True)
    input_tokens = serializers.IntegerField(read_only=True)
    output_tokens = serializers.IntegerField(read_only=True)


class UsageSerializer(serializers.Serializer):
    tenant = serializers.CharField(read_only=True)
    end_user = serializers.CharField(read_only=True, allow_null=True)
    group_by = serializers.CharField(read_only=True)
    start = serializers.DateField(read_only=True)
    end = serializers.DateField(read_only=True)
    timezone = serializers.CharField(read_only=True, help_text="The tenant's; days are local.")
    currency = serializers.CharField(read_only=True)
    unit = serializers.CharField(read_only=True, help_text="provider_cost or customer_price.")
    total = money_out(help_text="Spend of the whole range (every row, not just this page).")
    count = serializers.IntegerField(read_only=True, help_text="Rows in all pages.")
    next = serializers.URLField(read_only=True, allow_null=True)
    previous = serializers.URLField(read_only=True, allow_null=True)
    results = UsageRowSerializer(many=True, read_only=True)


# Rows in date order by day, else largest first (ties by name).
ORDER: dict[str, Callable[[dict[str, Any]], Any]] = {
    "day": lambda r: r["day"],
    "model": lambda r: (-r["total"], r["provider"], r["model"]),
    "end_user": usage.END_USER_SORTS["amount"],
}


def _row(row: dict[str, Any]) -> dict[str, Any]:
    out = {
        "amount": row["total"],
        "calls": row["n_calls"],
        "input_tokens": row["n_input"],
        "output_tokens": row["n_output"],
    }
    if "end_user__external_id" in row:
        out["end_user"] = row["end_user__external_id"]
    for key in ("day", "provider", "model"):
        if key in row:
            out[key] = row[key]
    return out


class TenantUsageView(ApiView):
    query_parameters = frozenset(UsageQuerySerializer().fields)

    @api_schema(
        operation_id="tenants_usage",
        summary="The tenant's spend by day, model or end user over a range of local days",
        parameters=[UsageQuerySerializer],
        responses={200: UsageSerializer, **errors(404)},
    )
    def get(self, request: Request, external_id: str) -> Response:
        data = self.valid(UsageQuerySerializer, request, query=True)
        tenant = tenant_for(request, external_id)
        with ledger_guard("read"):
            periods = usage.billing_periods(tenant, timezone.now())
            first, last = periods.days(periods.current)
            start, end = data.get("start") or first, data.get("end") or last
            end_user = None
            if data.get("end_user"):
                end_user = usage.end_user_named(tenant, data["end_user"])
            unit = usage.amount_unit(tenant)
            rows = live.usage_grouped(
                tenant,
                since=start,
                until=end,
                group_by=data["group_by"],
                unit=unit,
                end_user=end_user,
            )
            total = sum((r["total"] for r in rows), ZERO)
            rows.sort(key=ORDER[data["group_by"]])
            paginator = Pagination()
            page = paginator.paginate_queryset(rows, request, view=self)
            body = {
                "tenant": tenant.external_id,
                "end_user": data.get("end_user"),
                "group_by": data["group_by"],
                "start": start,
                "end": end,
                "timezone": tenant.timezone,
                "currency": conf.CURRENCY,
                "unit": unit,
                "total": round_charge(total),
                "count": paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "results": [_row(r) for r in page or []],
            }
        return Response(UsageSerializer(body).data)
