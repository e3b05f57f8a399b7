"""What the background jobs wrote: warning crossings (with their email delivery) and daily
usage rollups. Read-only: the jobs own these rows."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from llm_budgets.admin.base import ReadOnlyAdmin, money_text, when_column
from llm_budgets.models import DailyUsage, ThresholdCrossing


@admin.register(ThresholdCrossing)
class ThresholdCrossingAdmin(ReadOnlyAdmin):
    list_display = [
        "budget_label",
        "threshold",
        "period_when",
        "crossed_when",
        "state",
        "attempts",
        "sent_when",
    ]
    list_filter = ["state", "threshold"]
    list_select_related = ["budget__tenant", "budget__end_user"]
    search_fields = ["tenant__external_id", "recipients"]
    date_hierarchy = "crossed_at"
    fields = readonly_fields = (
        "budget",
        "tenant",
        "period_when",
        "threshold",
        "used_text",
        "crossed_when",
        "state",
        "attempts",
        "claimed_when",
        "sent_when",
        "recipients",
        "last_error",
    )

    period_when = when_column("period_start", "Period from")
    crossed_when = when_column("crossed_at", "Crossed at")
    claimed_when = when_column("claimed_at", "Claimed at")
    sent_when = when_column("sent_at", "Sent at")

    @admin.display(description="Budget", ordering="budget__scope")
    def budget_label(self, obj: ThresholdCrossing) -> str:
        return obj.budget.scope_label

    @admin.display(description="Spent + reserved at detection")
    def used_text(self, obj: ThresholdCrossing) -> str:
        used = money_text(obj.spent + obj.reserved, obj.currency)
        return format_html("{} of {}", used, money_text(obj.limit, obj.currency))


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyAdmin):
    list_display = ["day", "tenant", "end_user", "provider", "model", "calls", "cost_text"]
    list_filter = ["provider", "model"]
    list_select_related = ["tenant", "end_user__tenant"]
    search_fields = ["tenant__external_id", "end_user__external_id", "model"]
    date_hierarchy = "day"
    fields = readonly_fields = (
        "day",
        "tenant",
        "end_user",
        "provider",
        "model",
        "calls",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "cost_text",
        "estimated_text",
        "updated_when",
    )

    updated_when = when_column("updated_at", "Updated at")

    @admin.display(description="Cost", ordering="cost")
    def cost_text(self, obj: DailyUsage) -> str:
        return money_text(obj.cost, obj.currency)

    @admin.display(description="Of which estimated", ordering="estimated_cost")
    def estimated_text(self, obj: DailyUsage) -> str:
        return money_text(obj.estimated_cost, obj.currency)
