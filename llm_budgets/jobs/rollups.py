"""Daily usage rollups: per local day (the tenant's timezone), end user and model, the totals of
the ledger lines. Usage pages and reports read these rows instead of scanning the ledger.

A rollup is derived data: ``daily_usage_rebuild`` recomputes whole days from the ledger and
replaces their rows in one transaction, so running it twice, or after a crash, gives the same
result. The periodic job rebuilds the last ``ROLLUP_LOOKBACK_DAYS`` days, because a late commit
after expiry adds a true-up line to the day its reservation was made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.models import (
    DailyUsage,
    EndUser,
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


def daily_usage_rebuild(
    *, since: date, until: date, tenant: Tenant | None = None, now: datetime | None = None
) -> int:
    """Recompute the rollup rows of every local day from ``since`` to ``until`` (inclusive), for
    one tenant or all. Returns how many rows were written."""
    now = now or timezone.now()
    tenants = Tenant.objects.all() if tenant is None else Tenant.objects.filter(pk=tenant.pk)
    written = 0
    # One aggregate query per (time zone, day): day boundaries depend on the zone.
    for zone_name in sorted(set(tenants.values_list("timezone", flat=True))):
        zone = ZoneInfo(zone_name)
        zone_tenants = tenants.filter(timezone=zone_name)
        for day in _days(since, until):
            start, end = _day_bounds(day, zone)
            rows = (
                # What the tenant spent (a reset of one counter is not: docs/pages.md).
                UsageRecord.objects.spend()
                .filter(tenant__in=zone_tenants, reserved_at__gte=start, reserved_at__lt=end)
                .values("tenant_id", "end_user_id", "provider", "model", "currency")
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
            objects = [_row(day, row, now) for row in rows]
            with transaction.atomic():
                DailyUsage.objects.filter(day=day, tenant__in=zone_tenants).delete()
                DailyUsage.objects.bulk_create(objects)
                TenantDailyUsage.objects.filter(day=day, tenant__in=zone_tenants).delete()
                TenantDailyUsage.objects.bulk_create(tenant_totals(objects))
            written += len(objects)
    return written


def _row(day: date, row: Mapping[str, Any], now: datetime) -> DailyUsage:
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
