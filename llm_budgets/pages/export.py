"""The CSV export: one row per ledger line of the tenant's spend (``UsageRecord.objects.spend()``,
the one definition every tenant-facing total uses) for the tenant (or a member's end user) in a
range of local days, streamed from the ledger in the order of the index that serves it
(``llmb_usage_tenant_period``: tenant, then the reservation's time)."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import fields
from datetime import date
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from llm_budgets.models import UsageRecord
from llm_budgets.pages.access import Viewer
from llm_budgets.usage import Usage
from llm_budgets.windows import day_bounds

# The usage columns: every field of the one definition of usage, in its order (a field added to
# ``Usage`` is exported without a change here; ``tool_calls`` is a JSON object).
USAGE_COLUMNS = [f.name for f in fields(Usage)]
HEADER = [
    "time",
    "kind",
    "end_user",
    "provider",
    "model",
    *USAGE_COLUMNS,
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
    *USAGE_COLUMNS,
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
# A separator some spreadsheet may split a cell at (its locale's list separator), followed by
# blanks or quotes and a formula start: where a cell would begin with a formula once split.
_FORMULA_AFTER_SEPARATOR = re.compile(r"([,;\t|])([\s\"']*)(?=[=+\-@\t\r])")
CHUNK = 2000


def neutralise(text: str) -> str:
    """Text from the ledger (names, tags) as a cell no spreadsheet evaluates, whatever separator
    it reads the file with: a leading formula start is prefixed with ``'``, and so is one that
    follows a separator inside the text (``x;=1+1`` in a locale whose separator is ``;``).
    Every cell is also written quoted (``csv_lines``)."""
    text = _FORMULA_AFTER_SEPARATOR.sub(r"\1\2'", text)
    return "'" + text if text.startswith(FORMULA_START) else text


def _number(value: Decimal) -> str:
    """An amount in plain digits (``0E-10`` is how Python writes a stored zero)."""
    return format(value + 0, "f")  # + 0: no negative zero


def ledger_rows(viewer: Viewer, start: date, end: date) -> Iterator[list[Any]]:
    """The header, then each line (its reservation's time in the tenant's timezone)."""
    zone = ZoneInfo(viewer.tenant.timezone)
    since, until = day_bounds(start, end, zone)
    lines = UsageRecord.objects.spend().filter(tenant=viewer.tenant)
    if since is not None:
        lines = lines.filter(reserved_at__gte=since)
    if until is not None:
        lines = lines.filter(reserved_at__lt=until)
    if viewer.end_user is not None:
        lines = lines.filter(end_user__external_id=viewer.end_user)
    yield HEADER
    rows = lines.order_by("reserved_at", "id").values_list(*_FIELDS)
    for row in rows.iterator(chunk_size=CHUNK):
        values = dict(zip(_FIELDS, row, strict=True))
        tags, tool_calls = values["tags"], values["tool_calls"]
        yield [
            values["reserved_at"].astimezone(zone).isoformat(),
            values["kind"],
            neutralise(values["end_user__external_id"] or ""),
            neutralise(values["provider"]),
            neutralise(values["model"]),
            *(
                _json(tool_calls) if name == "tool_calls" else values[name]
                for name in USAGE_COLUMNS
            ),
            _number(values["cost"]),
            _number(values["customer_cost"]),
            neutralise(values["currency"]),
            "yes" if values["is_estimated"] else "no",
            _json(tags),
            str(values["reservation_id"] or ""),
        ]


def _json(value: dict[str, Any] | None) -> str:
    return neutralise(json.dumps(value, sort_keys=True, ensure_ascii=False)) if value else ""


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterator[list[Any]]) -> Iterator[str]:
    # Every cell quoted: a separator inside a cell never splits it in a reader using ``,``.
    writer = csv.writer(_Echo(), quoting=csv.QUOTE_ALL)
    for row in rows:
        yield writer.writerow(row)
