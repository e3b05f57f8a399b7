"""Reservations, their holds and the ledger lines: read-only, written only by the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from llm_budgets.admin.base import (
    ReadOnlyAdmin,
    ReadOnlyInline,
    end_user_link,
    money_text,
    short_id,
    tenant_zone,
    when_column,
    when_text,
)
from llm_budgets.admin.pricing import UnpricedModelFilter
from llm_budgets.models import Reservation, ReservationHold, UsageKind, UsageRecord
from llm_budgets.reads.overviews import adjustment_notes, voided_ids


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
        return f"{obj.provider}/{obj.model}" if obj.model else "-"

    @admin.display(description="End user", ordering="end_user__external_id")
    def end_user_link(self, obj: UsageRecord | Reservation) -> str:
        return end_user_link(obj.end_user)

    created_when = when_column("created_at", "When", seconds=True)


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

    @admin.display(description="Period from")
    def period_start(self, obj: ReservationHold) -> str:
        return when_text(obj.counter.period_start, tenant_zone(obj.counter))

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
        "created_when",
    )


@admin.register(Reservation)
class ReservationAdmin(UsageColumns, ReadOnlyAdmin):
    list_display = [
        "short_reservation_id",
        "tenant",
        "end_user_link",
        "call",
        "state",
        "amount_text",
        "created_when",
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
        "end_user_link",
        "provider",
        "model",
        "price",
        "pricing_basis",
        "input_tokens",
        "max_output_tokens",
        "amount_text",
        "markup_percent",
        "customer_amount_text",
        "idempotency_key",
        "created_when",
        "expires_when",
        "settled_when",
    )
    inlines = [ReservationHoldInline, UsageRecordInline]

    expires_when = when_column("expires_at", "Expires", seconds=True)
    settled_when = when_column("settled_at", "Settled", seconds=True)

    @admin.display(description="Reservation", ordering="id")
    def short_reservation_id(self, obj: Reservation) -> str:
        return format_html('<code title="{}">{}</code>', obj.pk, short_id(obj.pk))

    @admin.display(description="Held", ordering="amount")
    def amount_text(self, obj: Reservation) -> str:
        return money_text(obj.amount, obj.currency)

    @admin.display(description="Customer amount")
    def customer_amount_text(self, obj: Reservation) -> str:
        return money_text(obj.customer_amount, obj.currency)


@admin.register(UsageRecord)
class UsageRecordAdmin(UsageColumns, ReadOnlyAdmin):
    """The immutable ledger. A counter's spent is the sum of its lines. A voided line says so
    (and by which line); a compensating line says why and who made it."""

    list_display = [
        "created_when",
        "tenant",
        "end_user_link",
        "call",
        "kind",
        "cost_text",
        "note",
    ]
    list_filter = ["kind", "is_estimated", "provider", "pricing_basis", UnpricedModelFilter]
    list_select_related = ["tenant", "end_user__tenant"]
    search_fields = [
        "=id",
        "=reservation__id",
        "tenant__external_id",
        "end_user__external_id",
        "model",
    ]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "reservation_link",
        "kind",
        "note",
        "tenant",
        "end_user_link",
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
        "customer_cost_text",
        "overage_text",
        "is_estimated",
        "reserved_when",
        "created_when",
    )

    reserved_when = when_column("reserved_at", "Reserved at", seconds=True)

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if request.user.has_perm("llm_budgets.void_usagerecord"):
            fields.insert(fields.index("note") + 1, "void_action")
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        return self.get_fields(request, obj)

    @admin.display(description="Void")
    def void_action(self, obj: UsageRecord) -> str:
        """A link to the void form, for a charge that is not voided yet (billing admins)."""
        if obj.kind == UsageKind.ADJUSTMENT or obj.reservation_id is None:
            return "-"
        if UsageRecord.objects.filter(voids=obj).exists():
            return "-"
        url = reverse("admin:llm_budgets_tenant_void_line", args=[obj.tenant_id, obj.pk])
        return format_html('<a class="button" href="{}">Void this line&hellip;</a>', url)

    def annotate_page(self, request: HttpRequest, rows: list[UsageRecord]) -> None:
        voided, notes = voided_ids(rows), adjustment_notes(rows)
        for line in rows:
            line.llmb_voided_by = voided.get(line.pk)  # type: ignore[attr-defined]
            line.adjustment_note = notes.get(line.pk)  # type: ignore[attr-defined]

    @admin.display(description="Customer cost")
    def customer_cost_text(self, obj: UsageRecord) -> str:
        return money_text(obj.customer_cost, obj.currency)

    @admin.display(description="Note")
    def note(self, obj: UsageRecord) -> str:
        """Voided (by which line), or for a compensating line: what, why and who."""
        if not hasattr(obj, "llmb_voided_by"):  # the detail page: this one line
            self.annotate_page(None, [obj])  # type: ignore[arg-type]
        note = obj.adjustment_note  # type: ignore[attr-defined]
        voided_by: int | None = obj.llmb_voided_by  # type: ignore[attr-defined]
        if obj.kind == UsageKind.ADJUSTMENT:
            what = f"voids line {obj.voids_id}" if obj.voids_id else "end user's spend reset"
            if note is None:
                return what
            return format_html("{}: “{}” by {}", what, note.reason, note.actor or "?")
        if voided_by is not None:
            url = reverse("admin:llm_budgets_usagerecord_change", args=[voided_by])
            return format_html(
                '<strong>voided</strong> by <a href="{}">line {}</a>', url, voided_by
            )
        if obj.is_estimated:
            return "estimated (the call's usage never arrived)"
        return ""

    @admin.display(description="Reservation")
    def reservation_link(self, obj: UsageRecord) -> str:
        if obj.reservation_id is None:  # an adjustment of one counter (an end user's reset)
            return "- (an end user's spend reset)"
        url = reverse("admin:llm_budgets_reservation_change", args=[obj.reservation_id])
        return format_html(
            '<a href="{}" title="{}"><code>{}</code></a>',
            url,
            obj.reservation_id,
            short_id(obj.reservation_id),
        )
