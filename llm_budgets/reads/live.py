"""Live usage: what a tenant (or one of its end users) spent, per local day, model or end user, up
to the moment of the read, by the one definition of spend (``UsageRecord.objects.spend()``).

The daily rollups hold exactly the ledger lines up to their watermark (``RollupWatermark``,
``jobs.rollups``); the lines above it (and the few ids below it still in flight when it was
taken) are read from the ledger and added. Each line is counted once however the reads interleave
with a rollup run:

1. the watermark is read (``before``),
2. the rollup rows are read, each with the watermark it was written at (one statement: the rows
   and their watermark belong together, whatever commits around them),
3. the watermark is read again (``after``),
4. the ledger lines above ``max(before, the rows' highest watermark)`` are read, plus the in-flight
   ids both readings still list.

A rollup run that commits between 1 and 2 moves rows and watermark together, and the rows' own
watermark says so; one that commits after 2 changes nothing the rows said (the ledger is append
only: the lines above the rows' watermark are still there). The tail is what was written since
the last rollup run, read through the primary key: its size is the ledger's traffic since then,
whatever the size of the ledger (docs/performance.md, tenant pages).
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Count, Max, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from llm_budgets.db import statements
from llm_budgets.models import (
    BudgetUnit,
    DailyUsage,
    EndUser,
    RollupWatermark,
    Tenant,
    TenantDailyUsage,
    UsageKind,
    UsageRecord,
)
from llm_budgets.money import ZERO, round_charge
from llm_budgets.windows import day_bounds

# What a usage row is grouped by: the REST API's ``group_by`` and the pages' tables; "day_model"
# (each day's spend per model) draws the stacked chart.
GROUPS: dict[str, tuple[str, ...]] = {
    "day": ("day",),
    "model": ("provider", "model"),
    "end_user": ("end_user__external_id",),
    "day_model": ("day", "provider", "model"),
}


def decimal_of(value: object) -> Decimal:
    """A summed amount as Decimal (SQLite sums decimals as floats: through their text)."""
    if isinstance(value, Decimal):
        return value
    return Decimal(str(value or 0))


def amount_field(unit: str) -> str:
    return "customer_cost" if unit == BudgetUnit.CUSTOMER_PRICE else "cost"


# How many times a read is tried while rollup runs keep committing under it (see usage_grouped).
READ_ATTEMPTS = 3


def _watermark() -> tuple[int, frozenset[int]]:
    mark = RollupWatermark.objects.filter(pk=1).first()
    return (mark.through_id, mark.gap_ids) if mark is not None else (0, frozenset())


def usage_grouped(
    tenant: Tenant,
    *,
    since: date,
    until: date,
    group_by: str,
    unit: str,
    end_user: EndUser | None = None,
) -> list[dict[str, Any]]:
    """A tenant's (or one end user's) usage, local days ``since`` to ``until`` inclusive, up to
    now: one row per ``GROUPS[group_by]`` with ``total`` (a Decimal, in ``unit``), ``n_calls``,
    ``n_input`` and ``n_output``; unordered. Four queries: the watermark, the rollups (the
    tenant's totals by day or model from ``TenantDailyUsage``, a few rows per day; anything per
    end user from ``DailyUsage``), the watermark again, the ledger's tail."""
    keys = GROUPS[group_by]
    if end_user is not None and end_user.pk is None:
        return []  # an end user the ledger has not seen has spent nothing
    # The rollup rows and the watermark they were read against must be one state: a rollup run
    # that commits between the two readings would leave a line counted nowhere (filled gaps, new
    # gaps). The readings agree unless a run committed meanwhile; then read again (a run takes
    # seconds every few minutes, so a second try all but always agrees).
    field = amount_field(unit)
    width = len(keys)
    for _attempt in range(READ_ATTEMPTS):
        state = _watermark()
        rows: QuerySet[Any]
        if end_user is None and group_by != "end_user":
            rows = TenantDailyUsage.objects.filter(tenant=tenant, day__gte=since, day__lte=until)
        else:
            rows = DailyUsage.objects.filter(tenant=tenant, day__gte=since, day__lte=until)
            if end_user is not None:
                rows = rows.filter(end_user=end_user)
        # Per group: [total, calls, input tokens, output tokens], summed as read.
        merged: dict[tuple[Any, ...], list[Any]] = {}
        mark = state[0]
        for row in statements.grouped_rows(
            rows.values(*keys)
            .annotate(
                total=Sum(field),
                n_calls=Sum("calls"),
                n_input=Sum("input_tokens"),
                n_output=Sum("output_tokens"),
                mark=Max("through_id"),
            )
            .order_by(),
            keys=width,
        ):
            mark = max(mark, row[-1] or 0)
            merged[tuple(row[:width])] = [decimal_of(row[width]), *row[width + 1 : -1]]
        if _watermark() == state:
            break
    for line in statements.grouped_rows(
        _tail(
            tenant, since, until, ZoneInfo(tenant.timezone), end_user, mark, state[1], keys, field
        ),
        keys=width,
    ):
        key = tuple(line[:width])
        total, *counts = line[width:]
        sums = merged.setdefault(key, [ZERO, 0, 0, 0])
        sums[0] += decimal_of(total)
        for index, value in enumerate(counts, start=1):
            sums[index] = (sums[index] or 0) + (value or 0)
    result: list[dict[str, Any]] = []
    for key, (total, calls, n_input, n_output) in merged.items():
        # One dict per group (10^4 on the by-user page), filled in place.
        group: dict[str, Any] = dict(zip(keys, key, strict=True))
        group["total"] = round_charge(total)
        group["n_calls"] = int(calls or 0)
        group["n_input"] = int(n_input or 0)
        group["n_output"] = int(n_output or 0)
        result.append(group)
    return result


def _tail(
    tenant: Tenant,
    since: date,
    until: date,
    zone: ZoneInfo,
    end_user: EndUser | None,
    mark: int,
    gaps: frozenset[int],
    keys: tuple[str, ...],
    field: str,
) -> QuerySet[Any]:
    """The spend lines of the range that no rollup row read holds (above ``mark``, or in flight),
    summed per ``keys`` in the database (a local day is the tenant's)."""
    newer = Q(pk__gt=mark) | Q(pk__in=sorted(gaps)) if gaps else Q(pk__gt=mark)
    lines = UsageRecord.objects.spend().filter(newer, tenant=tenant)
    start, end = day_bounds(since, until, zone)
    if start is not None:
        lines = lines.filter(reserved_at__gte=start)
    if end is not None:
        lines = lines.filter(reserved_at__lt=end)
    if end_user is not None:
        lines = lines.filter(end_user=end_user)
    if "day" in keys:
        lines = lines.annotate(day=TruncDate("reserved_at", tzinfo=zone))
    return (
        lines.values(*keys)
        .annotate(
            total=Sum(field),
            n_calls=Count("pk", filter=Q(kind=UsageKind.CHARGE)),
            n_input=Sum("input_tokens"),
            n_output=Sum("output_tokens"),
        )
        .order_by()
    )


def daily_spend(
    tenant: Tenant, *, since: date, until: date, unit: str, end_user: EndUser | None = None
) -> dict[date, Decimal]:
    """Live spend per local day (days without spend absent)."""
    rows = usage_grouped(
        tenant, since=since, until=until, group_by="day", unit=unit, end_user=end_user
    )
    return {row["day"]: row["total"] for row in rows}
