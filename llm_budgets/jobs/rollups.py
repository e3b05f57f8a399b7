"""Daily usage rollups: per local day (the tenant's timezone), end user and model, the totals of
the ledger lines. Usage pages and reports read these rows instead of scanning the ledger.

A rollup is derived data: ``daily_usage_rebuild`` recomputes whole days from the ledger and
replaces their rows in one transaction, so running it twice, or after a crash, gives the same
result. The periodic job rebuilds the last ``ROLLUP_LOOKBACK_DAYS`` days, because a late commit
after expiry adds a true-up line to the day its reservation was made.

The watermark (``RollupWatermark``): every rebuild also rebuilds every day that a ledger line
written since the previous one belongs to, in the same transaction as it moves the watermark to
the ledger's last id, so the rollups always hold exactly the lines up to it (less the ids still in
flight, kept as gaps) and ``reads.live`` adds the rest: the pages never wait for this job.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.models import (
    DailyUsage,
    EndUser,
    RollupWatermark,
    Tenant,
    TenantDailyUsage,
    UsageKind,
    UsageRecord,
)
from llm_budgets.money import ZERO, round_charge


def _day_bounds(day: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=zone)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)
    return start, end


def _days(since: date, until: date) -> Iterable[date]:
    day = since
    while day <= until:
        yield day
        day += timedelta(days=1)


# An id below the watermark that no rollup has read is a settlement still in flight (its id was
# drawn before the watermark's, its commit came after) or one rolled back (its id is never used).
# After this long it can only be the second: it is forgotten.
GAP_TTL = timedelta(hours=1)
# At most this many such ids are remembered (a burst of rolled-back settlements).
MAX_GAPS = 10_000

logger = logging.getLogger("llm_budgets")


def _mark_for_update() -> RollupWatermark:
    """The watermark row, locked: one rebuild at a time moves it."""
    RollupWatermark.objects.get_or_create(pk=1)
    return RollupWatermark.objects.select_for_update().get(pk=1)


def _touched(lines: QuerySet[UsageRecord]) -> dict[str, dict[date, set[int]]]:
    """Per tenant timezone, the local days (and their tenants) the given lines belong to."""
    touched: dict[str, dict[date, set[int]]] = {}
    zones = dict(
        Tenant.objects.filter(pk__in=lines.values("tenant_id")).values_list("pk", "timezone")
    )
    for zone_name in set(zones.values()):
        in_zone = [pk for pk, name in zones.items() if name == zone_name]
        days = (
            lines.filter(tenant_id__in=in_zone)
            .annotate(local_day=TruncDate("reserved_at", tzinfo=ZoneInfo(zone_name)))
            .values_list("local_day", "tenant_id")
            .distinct()
            .order_by()
        )
        for day, tenant_id in days:
            touched.setdefault(zone_name, {}).setdefault(day, set()).add(tenant_id)
    return touched


def _gaps_after(mark: RollupWatermark, through: int, now: datetime) -> tuple[list[Any], list[int]]:
    """The gaps to remember after moving the watermark from ``mark.through_id`` to ``through``,
    and the remembered ones that are now committed (their days must be rebuilt)."""
    filled: list[int] = []
    kept: list[Any] = []
    old = {int(gap[0]): gap[1] for gap in mark.gaps or ()}
    if old:
        present = set(UsageRecord.objects.filter(pk__in=old).values_list("pk", flat=True))
        filled = sorted(present)
        for pk, seen in old.items():
            if pk not in present and datetime.fromisoformat(seen) > now - GAP_TTL:
                kept.append([pk, seen])
    if mark.through_id and through > mark.through_id:
        new = UsageRecord.objects.filter(pk__gt=mark.through_id, pk__lte=through)
        if new.count() < through - mark.through_id:
            present = set(new.values_list("pk", flat=True))
            # Newest first, and at most MAX_GAPS of them: a line in flight has an id near the
            # top; a jump of the id sequence (a restore, a sequence cache) must not make this a
            # walk over every number it skipped.
            missing = (pk for pk in range(through - 1, mark.through_id, -1) if pk not in present)
            newest = sorted(itertools.islice(missing, MAX_GAPS))
            if len(newest) == MAX_GAPS:
                logger.warning(
                    "llm_budgets: rollup watermark skipped more than %s ids; it remembers the "
                    "newest %s (older ones are rolled up by a later run's lookback)",
                    MAX_GAPS,
                    MAX_GAPS,
                )
            kept += [[pk, now.isoformat()] for pk in newest]
    return kept[-MAX_GAPS:], filled


def daily_usage_rebuild(
    *, since: date, until: date, tenant: Tenant | None = None, now: datetime | None = None
) -> int:
    """Recompute the rollup rows of every local day from ``since`` to ``until`` (inclusive), for
    one tenant or all, and move the watermark: every day (of any tenant) that a ledger line
    written since the last rebuild belongs to is rebuilt too, in the same transaction, so the
    rollups always hold exactly the lines up to the watermark (``RollupWatermark``) and a read
    that adds the lines above it counts each line once (``reads.live``). Returns how many rows
    were written."""
    now = now or timezone.now()
    written = 0
    with transaction.atomic():
        mark = _mark_for_update()
        through = UsageRecord.objects.aggregate(last=Max("pk"))["last"] or 0
        gaps, filled = _gaps_after(mark, through, now)
        if mark.through_id == 0:
            # The first rebuild reads the whole ledger: every day of every tenant with a line.
            plan = _touched(UsageRecord.objects.all())
        else:
            plan = _touched(
                UsageRecord.objects.filter(
                    Q(pk__gt=mark.through_id, pk__lte=through) | Q(pk__in=filled)
                )
            )
        tenants = Tenant.objects.all() if tenant is None else Tenant.objects.filter(pk=tenant.pk)
        for zone_name, pks in _by_zone(tenants).items():
            for day in _days(since, until):
                plan.setdefault(zone_name, {}).setdefault(day, set()).update(pks)
        gap_ids = [int(gap[0]) for gap in gaps]
        for zone_name in sorted(plan):
            zone = ZoneInfo(zone_name)
            for day, tenant_ids in sorted(plan[zone_name].items()):
                written += _rebuild_day(day, zone, tenant_ids, through, gap_ids, now)
        mark.through_id = max(mark.through_id, through)
        mark.gaps = gaps
        mark.updated_at = now
        mark.save(update_fields=["through_id", "gaps", "updated_at"])
    return written


def _by_zone(tenants: QuerySet[Tenant]) -> dict[str, set[int]]:
    zones: dict[str, set[int]] = {}
    for pk, zone_name in tenants.values_list("pk", "timezone"):
        zones.setdefault(zone_name, set()).add(pk)
    return zones


def _rebuild_day(
    day: date, zone: ZoneInfo, tenant_ids: set[int], through: int, gaps: list[int], now: datetime
) -> int:
    """Replace one local day's rows of these tenants (all in ``zone``) with the totals of their
    lines up to the watermark ``through`` (less the ids still in flight)."""
    start, end = _day_bounds(day, zone)
    lines = (
        # What the tenant spent (a reset of one counter is not: docs/pages.md).
        UsageRecord.objects.spend().filter(
            tenant_id__in=tenant_ids, reserved_at__gte=start, reserved_at__lt=end, pk__lte=through
        )
    )
    if gaps:
        lines = lines.exclude(pk__in=gaps)
    rows = (
        lines.values("tenant_id", "end_user_id", "provider", "model", "currency")
        # Annotation names differ from the fields they sum (Django resolves to the alias).
        .annotate(
            n_calls=Count("pk", filter=Q(kind=UsageKind.CHARGE)),
            n_input=Sum("input_tokens"),
            n_cached=Sum("cached_input_tokens"),
            n_output=Sum("output_tokens"),
            total=Sum("cost"),
            total_customer=Sum("customer_cost"),
            total_estimated=Sum("cost", filter=Q(is_estimated=True)),
        )
        .order_by()
    )
    objects = [_row(day, row, now, through) for row in rows]
    DailyUsage.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    DailyUsage.objects.bulk_create(objects)
    TenantDailyUsage.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    TenantDailyUsage.objects.bulk_create(tenant_totals(objects))
    return len(objects)


def _row(day: date, row: Mapping[str, Any], now: datetime, through: int) -> DailyUsage:
    # SQLite sums decimals with float-like scale: bring totals back to the stored precision.
    return DailyUsage(
        day=day,
        tenant_id=row["tenant_id"],
        end_user_id=row["end_user_id"],
        provider=row["provider"],
        model=row["model"],
        currency=row["currency"],
        calls=row["n_calls"],
        input_tokens=row["n_input"] or 0,
        cached_input_tokens=row["n_cached"] or 0,
        output_tokens=row["n_output"] or 0,
        cost=round_charge(Decimal(row["total"] or ZERO)),
        customer_cost=round_charge(Decimal(row["total_customer"] or ZERO)),
        estimated_cost=round_charge(Decimal(row["total_estimated"] or ZERO)),
        updated_at=now,
        through_id=through,
    )


def tenant_totals(rows: Iterable[DailyUsage]) -> list[TenantDailyUsage]:
    """``DailyUsage`` rows summed over end users, per (day, tenant, provider, model)."""
    totals: dict[tuple[Any, ...], TenantDailyUsage] = {}
    for row in rows:
        key = (row.day, row.tenant_id, row.provider, row.model)
        total = totals.get(key)
        if total is None:
            totals[key] = total = TenantDailyUsage(
                day=row.day,
                tenant_id=row.tenant_id,
                provider=row.provider,
                model=row.model,
                currency=row.currency,
                cost=ZERO,
                customer_cost=ZERO,
                estimated_cost=ZERO,
                updated_at=row.updated_at,
                through_id=row.through_id,
            )
        total.calls += row.calls
        total.input_tokens += row.input_tokens
        total.cached_input_tokens += row.cached_input_tokens
        total.output_tokens += row.output_tokens
        total.cost += row.cost
        total.customer_cost += row.customer_cost
        total.estimated_cost += row.estimated_cost
    return list(totals.values())


def daily_usage_refresh(*, now: datetime | None = None) -> int:
    """The periodic job: rebuild the last ``ROLLUP_LOOKBACK_DAYS`` days (and today everywhere)."""
    now = now or timezone.now()
    today = now.date()
    # Local "today" is at most a day either side of UTC's.
    return daily_usage_rebuild(
        since=today - timedelta(days=conf.ROLLUP_LOOKBACK_DAYS),
        until=today + timedelta(days=1),
        now=now,
    )


def daily_usage_rebuild_all(*, now: datetime | None = None) -> int:
    """Rebuild every day since the first ledger line (after a restore or a schema change)."""
    now = now or timezone.now()
    first = UsageRecord.objects.aggregate(first=Min("reserved_at"))["first"]
    if first is None:
        DailyUsage.objects.all().delete()
        TenantDailyUsage.objects.all().delete()
        return 0
    return daily_usage_rebuild(
        since=first.date() - timedelta(days=1), until=now.date() + timedelta(days=1), now=now
    )


@dataclass(frozen=True)
class DayTotal:
    day: date
    calls: int
    input_tokens: int
    output_tokens: int
    cost: Decimal
    customer_cost: Decimal
    estimated_cost: Decimal


def daily_usage_totals(
    tenant: Tenant, *, since: date, until: date, end_user: EndUser | None = None
) -> list[DayTotal]:
    """Read side: a tenant's (or one end user's) totals per local day, from the rollups only."""
    rows = DailyUsage.objects.filter(tenant=tenant, day__gte=since, day__lte=until)
    if end_user is not None:
        rows = rows.filter(end_user=end_user)
    return [
        DayTotal(
            day=row["day"],
            calls=row["n_calls"],
            input_tokens=row["n_input"],
            output_tokens=row["n_output"],
            cost=round_charge(Decimal(row["total"])),
            customer_cost=round_charge(Decimal(row["total_customer"])),
            estimated_cost=round_charge(Decimal(row["total_estimated"])),
        )
        for row in rows.values("day")
        .annotate(
            n_calls=Sum("calls"),
            n_input=Sum("input_tokens"),
            n_output=Sum("output_tokens"),
            total=Sum("cost"),
            total_customer=Sum("customer_cost"),
            total_estimated=Sum("estimated_cost"),
        )
        .order_by("day")
    ]
