"""Which period a moment falls in, for each window. Pure: no database here.

A period is identified by its start (an aware UTC datetime). Monthly periods start on the
tenant's billing day (clamped to the month's last day) at local midnight in its timezone; days and
hours follow the same timezone; the global cap uses UTC. Periods are computed, never stored ahead:
a counter row for a period is created lazily at its first admission.

Calendar boundaries are robust to DST (see ``docs/windows.md``): a day or month starts the first
time the tenant's wall clock reaches its midnight, or at the jump when that midnight is skipped;
a clock set back never reopens a period. An hour is the 60 minutes from a whole local hour, cut
short by an offset change.

A rolling window (``rolling:1h``, ``rolling:24h``, ``rolling:7d``...) is split into buckets; a
bucket is a counter row, and the window counts the current bucket plus the ``buckets`` before it.
"""

from __future__ import annotations

import calendar
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo

from django.db import models

from llm_budgets.exceptions import InvalidUsage

LIFETIME_START = datetime(1970, 1, 1, tzinfo=UTC)
ROLLING_PREFIX = "rolling:"
_UNITS = {"d": 86400, "h": 3600, "m": 60}
_ROLLING = re.compile(r"rolling:([1-9][0-9]{0,5})([dhm])")
MIN_ROLLING = timedelta(minutes=1)
MAX_ROLLING = timedelta(days=366)
BUCKETS_PER_WINDOW = 60  # target: the bucket is about 1/60 of the window
MAX_BUCKETS = 240
# Bucket sizes, in seconds: "round" durations that line up with clocks (buckets are aligned on
# the Unix epoch, so a 1h bucket starts on the UTC hour).
_BUCKET_LADDER = (
    1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 14400, 21600, 43200,
    86400, 172800, 259200, 518400,
)  # fmt: skip


class Window(models.TextChoices):
    MONTH = "month", "Month"
    DAY = "day", "Day"
    HOUR = "hour", "Hour"
    LIFETIME = "lifetime", "Lifetime"


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime | None  # None: the period never ends (lifetime)


@dataclass(frozen=True)
class RollingWindow:
    """A sliding window of ``duration``, counted in buckets of ``bucket``.

    At instant t the window counts the bucket containing t and the ``buckets`` buckets before it,
    so spend counts for at least ``duration`` and at most ``duration + bucket`` after it was
    reserved, then drops out a whole bucket at a time. Counting one bucket more than the duration
    keeps the cap hard: no interval of ``duration`` ever holds more than the limit.
    """

    duration: timedelta
    bucket: timedelta

    @property
    def buckets(self) -> int:
        return self.duration // self.bucket

    @property
    def name(self) -> str:
        return f"{ROLLING_PREFIX}{_duration_text(self.duration)}"

    def bucket_start(self, at: datetime) -> datetime:
        step = int(self.bucket.total_seconds())
        return datetime.fromtimestamp(int(at.timestamp()) // step * step, UTC)

    def span_start(self, at: datetime) -> datetime:
        """Start of the span of the window's length (aligned to the Unix epoch) that holds
        ``at``: what a once-per-period warning or alert of a rolling budget re-arms on."""
        step = int(self.duration.total_seconds())
        return datetime.fromtimestamp(int(at.timestamp()) // step * step, UTC)

    def counted_from(self, at: datetime) -> datetime:
        """Start of the oldest bucket still counted at ``at``."""
        return self.bucket_start(at) - self.buckets * self.bucket

    def leaves_at(self, bucket_start: datetime) -> datetime:
        """When the bucket starting at ``bucket_start`` stops being counted."""
        return bucket_start + (self.buckets + 1) * self.bucket

    def fits_at(self, usage: Iterable[tuple[datetime, Decimal]], need: Decimal) -> datetime | None:
        """The first moment ``need`` more has dropped out, given ``(bucket_start, amount)`` of the
        buckets now counted (holds assumed to stay). None if the window is empty."""
        freed = Decimal(0)
        last = None
        for start, amount in sorted(usage):
            if amount <= 0:
                continue
            freed += amount
            last = self.leaves_at(start)
            if freed >= need:
                return last
        return last  # never enough (need exceeds the limit): when the window is empty


def _duration_text(duration: timedelta) -> str:
    seconds = int(duration.total_seconds())
    for unit, size in _UNITS.items():
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("durations are whole minutes")


def _bucket_for(seconds: int) -> int:
    return max(b for b in _BUCKET_LADDER if b * BUCKETS_PER_WINDOW <= seconds and seconds % b == 0)


@lru_cache(maxsize=256)
def rolling_window(window: str) -> RollingWindow | None:
    """The rolling window named ``window``, or None for a calendar window. Raises
    ``InvalidUsage`` for a malformed or out-of-range rolling window."""
    if not window.startswith(ROLLING_PREFIX):
        return None
    match = _ROLLING.fullmatch(window)
    if match is None:
        raise InvalidUsage(
            f"window {window!r} is not a rolling window: write rolling:<number><unit> with unit "
            "m, h or d, e.g. rolling:1h, rolling:24h, rolling:7d.",
            field="window",
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    duration = timedelta(seconds=seconds)
    if not MIN_ROLLING <= duration <= MAX_ROLLING:
        raise InvalidUsage(
            f"window {window!r}: a rolling window is from 1m to 366d long.", field="window"
        )
    bucket = _bucket_for(seconds)
    if seconds // bucket > MAX_BUCKETS:
        size = max(b for b in _BUCKET_LADDER if b * BUCKETS_PER_WINDOW <= seconds)
        rounded = timedelta(seconds=max(size, seconds // size * size))
        raise InvalidUsage(
            f"window {window!r} would need {seconds // bucket} buckets (at most {MAX_BUCKETS}): "
            f"use a multiple of {_duration_text(timedelta(seconds=size))}, "
            f"e.g. {ROLLING_PREFIX}{_duration_text(rounded)}.",
            field="window",
        )
    return RollingWindow(duration, timedelta(seconds=bucket))


def window_name(window: object) -> str:
    """The canonical name of a window (``rolling:24h`` is ``rolling:1d``), or ``InvalidUsage``."""
    if not isinstance(window, str):
        raise InvalidUsage(f"window must be a string, got {window!r}.", field="window")
    if window in Window.values:
        return window
    rolling = rolling_window(window)
    if rolling is None:
        raise InvalidUsage(
            f"window must be one of {', '.join(Window.values)} or rolling:<duration> "
            f"(e.g. rolling:1h), got {window!r}.",
            field="window",
        )
    return rolling.name


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _anchor(year: int, month: int, billing_day: int) -> date:
    return date(year, month, min(billing_day, calendar.monthrange(year, month)[1]))


def _add_months(year: int, month: int, delta: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + delta
    return index // 12, index % 12 + 1


def _offset_change(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The instant in ``(before, after]`` at which ``zone``'s UTC offset changes (tz data changes
    offsets on whole seconds)."""
    low, high = math.floor(before.timestamp()), math.ceil(after.timestamp())
    offset = before.astimezone(zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == offset:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


def _reached(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant the wall clock of ``zone`` reads ``wall`` (naive) or later."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first  # exists; if it is repeated, its first occurrence
    # Skipped by a jump forward (e.g. midnight in America/Santiago): the period starts at the jump.
    return _offset_change(wall.replace(tzinfo=zone, fold=1).astimezone(UTC), first, zone)


def _calendar_period(
    at: datetime, zone: ZoneInfo, wall: datetime, step: Callable[[datetime], datetime]
) -> Period:
    """``[reached(wall), reached(next wall))`` for the last boundary ``wall`` already reached."""
    start = _reached(wall, zone)
    while True:
        following = step(wall)
        end = _reached(following, zone)
        if at < end:
            return Period(start, end)
        wall, start = following, end  # a clock set back: the next period has already begun


def _hour(at: datetime, zone: ZoneInfo) -> Period:
    local = at.astimezone(zone)
    offset = local.utcoffset()
    past = timedelta(minutes=local.minute, seconds=local.second, microseconds=local.microsecond)
    whole = at - past
    start, end = whole, whole + timedelta(hours=1)
    # An offset change inside the hour (e.g. Australia/Lord_Howe's half-hour shifts) bounds it.
    if start.astimezone(zone).utcoffset() != offset:
        start = _offset_change(start, at, zone)
    if end.astimezone(zone).utcoffset() != offset:
        end = _offset_change(at, end, zone)
    return Period(start, end)


def _next_month_anchor(billing_day: int) -> Callable[[datetime], datetime]:
    def step(wall: datetime) -> datetime:
        year, month = _add_months(wall.year, wall.month, 1)
        return datetime.combine(_anchor(year, month, billing_day), wall.time())

    return step


def period_for(window: str, at: datetime, *, timezone: str = "UTC", billing_day: int = 1) -> Period:
    """The period of ``window`` that contains ``at`` (an aware datetime). For a rolling window,
    the current bucket: the counter a hold taken at ``at`` lands on."""
    if window == Window.LIFETIME:
        return Period(LIFETIME_START, None)
    rolling = rolling_window(window) if window.startswith(ROLLING_PREFIX) else None
    if rolling is not None:
        start = rolling.bucket_start(at)
        return Period(start, start + rolling.bucket)
    zone = _zone(timezone)
    local = at.astimezone(zone).replace(tzinfo=None)
    if window == Window.HOUR:
        return _hour(at, zone)
    if window == Window.DAY:
        midnight = datetime.combine(local.date(), datetime.min.time())
        return _calendar_period(at, zone, midnight, lambda wall: wall + timedelta(days=1))
    if window == Window.MONTH:
        anchor = _anchor(local.year, local.month, billing_day)
        if local.date() < anchor:
            year, month = _add_months(local.year, local.month, -1)
            anchor = _anchor(year, month, billing_day)
        wall = datetime.combine(anchor, datetime.min.time())
        return _calendar_period(at, zone, wall, _next_month_anchor(billing_day))
    raise ValueError(
        f"Unknown window {window!r}; expected one of {', '.join(Window.values)} or "
        "rolling:<duration>."
    )


class CalendarOwner(Protocol):
    """What a tenant contributes to its calendar (see ``Tenant``)."""

    timezone: str
    billing_day: int
    previous_timezone: str
    previous_billing_day: int | None
    calendar_effective_from: datetime | None


def tenant_period(window: str, at: datetime, tenant: CalendarOwner) -> Period:
    """The period of a tenant's budget containing ``at``.

    A change of timezone or billing day takes effect at ``calendar_effective_from`` (the end of
    the monthly period in which it was made): before it the previous calendar applies, and the
    first period after it starts there, never earlier, so no change resets a budget early and
    no spend is counted in two periods."""
    effective_from = tenant.calendar_effective_from
    if effective_from is None or tenant.previous_billing_day is None:
        return period_for(window, at, timezone=tenant.timezone, billing_day=tenant.billing_day)
    if at < effective_from:
        return period_for(
            window,
            at,
            timezone=tenant.previous_timezone,
            billing_day=tenant.previous_billing_day,
        )
    period = period_for(window, at, timezone=tenant.timezone, billing_day=tenant.billing_day)
    if window == Window.LIFETIME or window.startswith(ROLLING_PREFIX):
        return period
    return Period(max(period.start, effective_from), period.end)


class WindowOwner(Protocol):
    """What a budget contributes to its period: its window and its tenant (None: global)."""

    window: str

    @property
    def tenant(self) -> CalendarOwner | None: ...


def budget_period(budget: WindowOwner, at: datetime) -> Period:
    """The period of ``budget`` containing ``at``: its tenant's calendar, or UTC's for a budget
    without a tenant (global)."""
    if budget.tenant is None:
        return period_for(budget.window, at)
    return tenant_period(budget.window, at, budget.tenant)


def day_bounds(since: date, until: date, zone: ZoneInfo) -> tuple[datetime | None, datetime | None]:
    """From the start of local day ``since`` to the end of local day ``until``; None where the
    range reaches the calendar's first or last day (no bound: such a time is not representable
    in every timezone)."""
    margin = timedelta(days=2)
    start = datetime.combine(since, time(0), tzinfo=zone) if since > date.min + margin else None
    end = (
        datetime.combine(until + timedelta(days=1), time(0), tzinfo=zone)
        if until < date.max - margin
        else None
    )
    return start, end
