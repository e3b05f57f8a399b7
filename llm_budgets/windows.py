"""Which period a moment falls in, for each window.

A period is identified by its start (an aware UTC datetime). Monthly periods start on the
tenant's billing day (clamped to the month's last day) at local midnight in its timezone; days and
hours follow the same timezone; the global cap uses UTC. Periods are computed, never stored ahead:
a counter row for a period is created lazily at its first admission.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from llm_budgets.models import Window

LIFETIME_START = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime | None  # None: the period never ends (lifetime)


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _anchor(year: int, month: int, billing_day: int) -> date:
    return date(year, month, min(billing_day, calendar.monthrange(year, month)[1]))


def _add_months(year: int, month: int, delta: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + delta
    return index // 12, index % 12 + 1


def _local_midnight(day: date, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


def period_for(window: str, at: datetime, *, timezone: str = "UTC", billing_day: int = 1) -> Period:
    """The period of ``window`` that contains ``at`` (an aware datetime)."""
    if window == Window.LIFETIME:
        return Period(LIFETIME_START, None)
    zone = _zone(timezone)
    local = at.astimezone(zone)
    if window == Window.HOUR:
        start_local = local.replace(minute=0, second=0, microsecond=0)
        start = start_local.astimezone(UTC)
        return Period(start, start + timedelta(hours=1))
    if window == Window.DAY:
        today = local.date()
        return Period(
            _local_midnight(today, zone), _local_midnight(today + timedelta(days=1), zone)
        )
    if window == Window.MONTH:
        anchor = _anchor(local.year, local.month, billing_day)
        if local.date() < anchor:
            year, month = _add_months(local.year, local.month, -1)
            anchor = _anchor(year, month, billing_day)
        year, month = _add_months(anchor.year, anchor.month, 1)
        following = _anchor(year, month, billing_day)
        return Period(_local_midnight(anchor, zone), _local_midnight(following, zone))
    raise ValueError(f"Unknown window {window!r}; expected one of {', '.join(Window.values)}.")
