"""The audit log: read-only, append-only."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from llm_budgets import clock
from llm_budgets.admin.base import (
    ReadOnlyAdmin,
    row_zone,
    truncated,
    when_column,
)
from llm_budgets.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["created_when", "action", "actor", "tenant", "short_target", "short_reason"]
    list_filter = ["action"]
    list_select_related = ["tenant"]
    search_fields = ["actor", "target", "reason", "tenant__external_id"]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "created_when",
        "action",
        "actor",
        "tenant",
        "target_text",
        "before_json",
        "after_json",
        "reason",
    )

    created_when = when_column("created_at", "When", seconds=True)

    @admin.display(description="Target", ordering="target")
    def short_target(self, obj: AuditEvent) -> str:
        # Not cut: a cut would drop a time's zone label; a long target wraps.
        return clock.readable(obj.target, row_zone(obj))

    @admin.display(description="Target")
    def target_text(self, obj: AuditEvent) -> str:
        return clock.readable(obj.target, row_zone(obj))

    @admin.display(description="Reason", ordering="reason")
    def short_reason(self, obj: AuditEvent) -> str:
        return truncated(obj.reason, 50)

    @admin.display(description="Before")
    def before_json(self, obj: AuditEvent) -> str:
        return _pretty(obj.before)

    @admin.display(description="After")
    def after_json(self, obj: AuditEvent) -> str:
        return _pretty(obj.after)


def _pretty(value: object) -> str:
    if value is None:
        return "-"
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))
