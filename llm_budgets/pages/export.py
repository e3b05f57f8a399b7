"""The CSV export: one row per ledger line of the tenant (or a member's end user) in a range of
local days, streamed from the ledger in the order of the index that serves it
(``llmb_usage_tenant_period``: tenant, then the reservation's time)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from llm_budgets.models import UsageRecord
from llm_budgets.pages.access import Viewer

HEADER = [
    "time",
    "kind",
    "end_user",
    "provider",
    "model",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost",
    "customer_cost",
    "currency",
    "estimated",
    "tags",
    "reservation",
]
_FIELDS = [
    "reserved_at",
    "kind",
    "end_user__external_id",
    "provider",
    "model",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost",
    "customer_cost",
    "currency",
    "is_estimated",
    "tags",
    "reservation_id",
]
# Text a spreadsheet would run as a formula (OWASP "CSV injection"), plus the control characters
# some spreadsheets skip before looking for one.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
CHUNK = 2000


def neutralise(text: str) -> str:
    """Text from the ledger (names, tags) as a cell no spreadsheet evaluates."""
    return "'" + text if text.startswith(FORMULA_START) else text


def day_bounds(start: date, end: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """From the start of local day ``start`` to the end of local day ``end``."""
    since = datetime.combine(start, time(0), tzinfo=zone)
    until = datetime.combine(end + timedelta(days=1), time(0), tzinfo=zone)
    return since, until


def ledger_rows(viewer: Viewer, start: date, end: date) -> Iterator[list[Any]]:
    """The header, then each line (its reservation's time in the tenant's timezone)."""
    zone = ZoneInfo(viewer.tenant.timezone)
    since, until = day_bounds(start, end, zone)
    lines = UsageRecord.objects.filter(
        tenant=viewer.tenant, reserved_at__gte=since, reserved_at__lt=until
    )
    if viewer.end_user is not None:
        lines = lines.filter(end_user__external_id=viewer.end_user)
    yield HEADER
    rows = lines.order_by("reserved_at", "id").values_list(*_FIELDS)
    for row in rows.iterator(chunk_size=CHUNK):
        at, kind, end_user, provider, model, *counts, tags, reservation = row
        yield [
            at.astimezone(zone).isoformat(),
            kind,
            neutralise(end_user or ""),
            neutralise(provider),
            neutralise(model),
            *counts[:7],
            counts[7],  # currency
            "yes" if counts[8] else "no",
            neutralise(json.dumps(tags, sort_keys=True, ensure_ascii=False)) if tags else "",
            str(reservation or ""),
        ]


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterator[list[Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    for row in rows:
        yield writer.writerow(row)
