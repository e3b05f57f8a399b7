"""The alerts part at the ledger (``llm_budgets.hooks``): the events the core records in the
transaction of their cause (a kill switch, a refusal, a closed run, a crossed threshold, an
expired hold) become alert events and delivery rows there (``alerts.emit``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from llm_budgets.alerts.emit import alert_emit, alerts_emit_many, subscribed, subscribed_by_any
from llm_budgets.hooks import EventItem, LedgerHooks
from llm_budgets.models import Tenant


class AlertHooks(LedgerHooks):
    def event_wanted(self, event_type: str, tenant_id: int | None) -> bool:
        return subscribed(event_type, tenant_id)

    def event_wanted_by_any(self, event_type: str) -> bool:
        return subscribed_by_any(event_type)

    def event_record(
        self,
        event_type: str,
        *,
        body: dict[str, Any],
        tenant: Tenant | int | None,
        dedupe_key: str | None,
        now: datetime | None,
        guard: str | None,
    ) -> None:
        alert_emit(
            event_type, body=body, tenant=tenant, dedupe_key=dedupe_key, now=now, guard=guard
        )

    def events_record_many(
        self,
        event_type: str,
        items: Sequence[EventItem],
        *,
        now: datetime | None,
        guard: str | None,
    ) -> None:
        alerts_emit_many(event_type, items, now=now, guard=guard)
