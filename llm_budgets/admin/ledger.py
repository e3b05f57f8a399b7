"""Reservations, their holds and the ledger lines: read-only, written only by the services."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from llm_budgets.admin.base import ReadOnlyAdmin, ReadOnlyInline, money_text
from llm_budgets.admin.pricing import UnpricedModelFilter
from llm_budgets.models import Reservation, ReservationHold, UsageRecord


class UsageColumns:
    """Columns shared by every view of ledger lines."""

    @admin.display(description="Cost", ordering="cost")
    def cost_text(self, obj: UsageRecord) -> str:
        return money_text(obj.cost, obj.currency)

    @admin.display(description="Overage", ordering="overage")
    def overage_text(self, obj: UsageRecord) -> str:
        return money_text(obj.overage, obj.currency)

    @admin.display(description="Call", ordering="model")
    def call(self, obj: UsageRecord | Reservation) -> str:
        return f"{obj.provider}/{obj.model}"


class ReservationHoldInline(ReadOnlyInline):
    model = ReservationHold
    verbose_name = "hold"
    verbose_name_plural = "held on counters"
    fields = readonly_fields = ("budget", "period_start", "counter_now")
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReservationHold]:
        return (
            super()
            .get_queryset(request)
            .select_related("counter__budget__tenant", "counter__budget__end_user")
        )

    @admin.display(description="Budget")
    def budget(self, obj: ReservationHold) -> str:
        return f"{obj.counter.budget.scope_label}, {obj.counter.budget.window}"

    @admin.display(description="Period start")
    def period_start(self, obj: ReservationHold) -> str:
        return f"{obj.counter.period_start:%Y-%m-%d %H:%M} UTC"

    @admin.display(description="Counter now")
    def counter_now(self, obj: ReservationHold) -> str:
        counter, currency = obj.counter, obj.counter.budget.currency
        return format_html(
            '<a href="{}">spent {}, reserved {}</a>',
            reverse("admin:llm_budgets_counter_change", args=[counter.pk]),
            money_text(counter.spent, currency),
            money_text(counter.reserved, currency),
        )


class UsageRecordInline(UsageColumns, ReadOnlyInline):
    model = UsageRecord
    verbose_name_plural = "ledger lines"
    fields = readonly_fields = (
        "kind",
        "cost_text",
        "overage_text",
        "is_estimated",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "created_at",
    )


@admin.register(Reservation)
class ReservationAdmin(UsageColumns, ReadOnlyAdmin):
    list_display = [
        "id",
        "tenant",
        "end_user",
        "call",
        "amount_text",
        "state",
        "created_at",
        "expires_at",
        "settled_at",
    ]
    list_filter = ["state", "provider", "pricing_basis", UnpricedModelFilter]
    list_select_related = ["tenant", "end_user__tenant"]
    search_fields = [
        "=id",
        "=idempotency_key",
        "tenant__external_id",
        "end_user__external_id",
        "model",
    ]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "id",
        "state",
        "tenant",
        "end_user",
        "provider",
        "model",
        "price",
        "pricing_basis",
        "input_tokens",
        "max_output_tokens",
        "amount_text",
        "markup_percent",
        "customer_amount",
        "idempotency_key",
        "created_at",
        "expires_at",
        "settled_at",
    )
    inlines = [ReservationHoldInline, UsageRecordInline]

    @admin.display(description="Held", ordering="amount")
    def amount_text(self, obj: Reservation) -> str:
        return money_text(obj.amount, obj.currency)


@admin.register(UsageRecord)
class UsageRecordAdmin(UsageColumns, ReadOnlyAdmin):
    """The immutable ledger. A counter's spent is the sum of its lines."""

    list_display = [
        "created_at",
        "tenant",
        "end_user",
        "call",
        "kind",
        "cost_text",
        "overage_text",
        "is_estimated",
        "reservation_link",
    ]
    list_filter = ["kind", "is_estimated", "provider", "pricing_basis", UnpricedModelFilter]
    list_select_related = ["tenant", "end_user__tenant"]
    search_fields = [
        "=reservation__id",
        "tenant__external_id",
        "end_user__external_id",
        "model",
    ]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "reservation_link",
        "kind",
        "tenant",
        "end_user",
        "provider",
        "model",
        "price",
        "pricing_basis",
        "input_tokens",
        "cached_input_tokens",
        "cache_write_tokens",
        "cache_write_1h_tokens",
        "output_tokens",
        "reasoning_tokens",
        "tool_calls",
        "cost_text",
        "customer_cost",
        "overage_text",
        "is_estimated",
        "reserved_at",
        "created_at",
    )

    @admin.display(description="Reservation")
    def reservation_link(self, obj: UsageRecord) -> str:
        if obj.reservation_id is None:  # an adjustment of one counter (an end user's reset)
            return f"- (counter {obj.counter_id})"
        url = reverse("admin:llm_budgets_reservation_change", args=[obj.reservation_id])
        return format_html('<a href="{}">{}</a>', url, obj.reservation_id)
