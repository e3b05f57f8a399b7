"""Calendar edge cases (issue 4, item 2): short months, DST in the tenant's zone (including zones
whose midnight is skipped), year end, and a tenant changing its calendar mid-period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
import time_machine
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import AuditEvent, Counter, Tenant, UsageRecord
from llm_budgets.tenancy.tenants import _schedule_calendar_change
from llm_budgets.windows import period_for, tenant_period
from tests.factories import reserve_30, seed

# Moves time with time_machine: admission follows this process's clock (conftest).
pytestmark = pytest.mark.usefixtures("application_clock")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(zone: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


# --- Billing day 31 in short months, in a tenant's zone --------------------------------------


@pytest.mark.parametrize(
    ("at", "start", "end"),
    [
        # 2028 is a leap year: the February period starts on the 29th.
        ((2028, 2, 28, 12), (2028, 1, 31), (2028, 2, 29)),
        ((2028, 2, 29, 0, 0), (2028, 2, 29), (2028, 3, 31)),
        # 2027 is not: the 28th.
        ((2027, 2, 27, 23, 59), (2027, 1, 31), (2027, 2, 28)),
        ((2027, 2, 28, 0, 0), (2027, 2, 28), (2027, 3, 31)),
        ((2027, 3, 30, 23, 59), (2027, 2, 28), (2027, 3, 31)),
        # April has 30 days.
        ((2027, 4, 29, 23, 59), (2027, 3, 31), (2027, 4, 30)),
        ((2027, 4, 30, 0, 0), (2027, 4, 30), (2027, 5, 31)),
    ],
)
def test_billing_day_31_in_new_york(
    at: tuple[int, ...], start: tuple[int, ...], end: tuple[int, ...]
) -> None:
    zone = "America/New_York"
    period = period_for("month", local(zone, *at), timezone=zone, billing_day=31)
    assert (period.start, period.end) == (local(zone, *start), local(zone, *end))


def test_billing_day_29_in_a_non_leap_february_returns_to_the_29th_in_march() -> None:
    period = period_for("month", utc(2027, 3, 1), billing_day=29)
    assert (period.start, period.end) == (utc(2027, 2, 28), utc(2027, 3, 29))


# --- DST in the tenant's zone ----------------------------------------------------------------


def test_amsterdam_spring_forward_day_has_23_hours() -> None:
    zone = "Europe/Amsterdam"  # 2026-03-29 02:00 CET -> 03:00 CEST
    period = period_for("day", local(zone, 2026, 3, 29, 12), timezone=zone)
    assert (period.start, period.end) == (utc(2026, 3, 28, 23), utc(2026, 3, 29, 22))
    assert period.end - period.start == timedelta(hours=23)


def test_amsterdam_fall_back_day_has_25_hours() -> None:
    zone = "Europe/Amsterdam"  # 2026-10-25 03:00 CEST -> 02:00 CET
    period = period_for("day", local(zone, 2026, 10, 25, 2, 30, fold=1), timezone=zone)
    assert (period.start, period.end) == (utc(2026, 10, 24, 22), utc(2026, 10, 25, 23))


def test_amsterdam_month_spanning_dst_is_whole_local_months() -> None:
    zone = "Europe/Amsterdam"
    period = period_for("month", utc(2026, 3, 20), timezone=zone, billing_day=15)
    # Starts at CET midnight, ends at CEST midnight: one hour shorter than 31 x 24 h.
    assert (period.start, period.end) == (utc(2026, 3, 14, 23), utc(2026, 4, 14, 22))


@pytest.mark.parametrize("fold", [0, 1])
def test_new_york_repeated_hour_is_two_hours(fold: int) -> None:
    zone = "America/New_York"  # 2026-11-01 02:00 EDT -> 01:00 EST: 01:xx happens twice
    at = local(zone, 2026, 11, 1, 1, 30, fold=fold)
    period = period_for("hour", at, timezone=zone)
    start = utc(2026, 11, 1, 5) if fold == 0 else utc(2026, 11, 1, 6)
    assert (period.start, period.end) == (start, start + timedelta(hours=1))


def test_new_york_skipped_hour() -> None:
    zone = "America/New_York"  # 2026-03-08 02:00 EST -> 03:00 EDT
    before = period_for("hour", utc(2026, 3, 8, 6, 59), timezone=zone)
    after = period_for("hour", utc(2026, 3, 8, 7, 0), timezone=zone)
    assert (before.start, before.end) == (utc(2026, 3, 8, 6), utc(2026, 3, 8, 7))
    assert (after.start, after.end) == (utc(2026, 3, 8, 7), utc(2026, 3, 8, 8))


@pytest.mark.parametrize(
    ("zone", "jump", "day"),
    [
        # Clocks go from 23:59:59 to 01:00: local midnight of that day never exists.
        ("America/Santiago", utc(2026, 9, 6, 4), (2026, 9, 6)),
        ("Asia/Beirut", utc(2026, 3, 28, 22), (2026, 3, 29)),
    ],
)
def test_skipped_midnight_day_starts_at_the_jump(
    zone: str, jump: datetime, day: tuple[int, int, int]
) -> None:
    second_before = jump - timedelta(seconds=1)
    assert second_before.astimezone(ZoneInfo(zone)).date() < datetime(*day).date()
    today = period_for("day", jump, timezone=zone)
    yesterday = period_for("day", second_before, timezone=zone)
    assert today.start == jump == yesterday.end
    assert today.end == local(zone, *day, 0) + timedelta(days=1) - timedelta(hours=1)
    # A month anchored on that day starts at the jump too.
    month = period_for("month", jump + timedelta(days=3), timezone=zone, billing_day=day[2])
    assert month.start == jump
    assert period_for("month", second_before, timezone=zone, billing_day=day[2]).end == jump


def test_santiago_fall_back_at_midnight_repeats_the_evening_not_the_day() -> None:
    zone = "America/Santiago"  # 2026-04-05 00:00 -03 -> 2026-04-04 23:00 -04
    first = local(zone, 2026, 4, 4, 23, 30, fold=0)
    second = local(zone, 2026, 4, 4, 23, 30, fold=1)
    assert second - first == timedelta(hours=1)
    day_first = period_for("day", first, timezone=zone)
    day_second = period_for("day", second, timezone=zone)
    assert day_first == day_second
    assert day_first.end == utc(2026, 4, 5, 4)
    assert day_first.end - day_first.start == timedelta(hours=25)


def test_lord_howe_half_hour_shift_bounds_the_hour() -> None:
    zone = "Australia/Lord_Howe"  # 2026-04-05 02:00 +11 -> 01:30 +10:30 (at 15:00 UTC)
    before = period_for("hour", utc(2026, 4, 4, 14, 45), timezone=zone)  # 01:45 +11
    after = period_for("hour", utc(2026, 4, 4, 15, 15), timezone=zone)  # 01:45 +10:30 again
    assert (before.start, before.end) == (utc(2026, 4, 4, 14), utc(2026, 4, 4, 15))
    assert (after.start, after.end) == (utc(2026, 4, 4, 15), utc(2026, 4, 4, 15, 30))


def test_apia_skipped_a_whole_day() -> None:
    # Samoa moved across the date line: 2011-12-29 23:59:59 -10 was followed by 12-31 00:00 +14.
    zone = "Pacific/Apia"
    jump = utc(2011, 12, 30, 10)
    assert period_for("day", jump - timedelta(seconds=1), timezone=zone).end == jump
    day = period_for("day", jump, timezone=zone)
    assert (day.start, day.end) == (jump, jump + timedelta(days=1))
    month = period_for("month", jump, timezone=zone, billing_day=30)
    assert month.start == jump


# --- Year end --------------------------------------------------------------------------------


@pytest.mark.parametrize("window", ["hour", "day", "month"])
@pytest.mark.parametrize("zone", ["UTC", "Pacific/Auckland", "America/New_York"])
def test_year_end_boundary(window: str, zone: str) -> None:
    new_year = local(zone, 2027, 1, 1)
    last = period_for(window, new_year - timedelta(microseconds=1), timezone=zone)
    first = period_for(window, new_year, timezone=zone)
    assert last.end == first.start == new_year


# --- Properties over many zones: periods tile time --------------------------------------------

ZONES = [
    "UTC",
    "Europe/Amsterdam",
    "America/New_York",
    "America/Santiago",
    "Asia/Beirut",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Apia",
    "America/Havana",
    "Pacific/Chatham",
]


@settings(max_examples=400, deadline=None)
@given(
    at=st.datetimes(
        min_value=datetime(2010, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
    ),
    zone=st.sampled_from(ZONES),
    window=st.sampled_from(["hour", "day", "month"]),
    billing_day=st.integers(1, 31),
)
def test_periods_tile_time(at: datetime, zone: str, window: str, billing_day: int) -> None:
    period = period_for(window, at, timezone=zone, billing_day=billing_day)
    assert period.end is not None
    assert period.start <= at < period.end
    # The next period starts exactly where this one ends, and the period is stable.
    assert period_for(window, period.end, timezone=zone, billing_day=billing_day).start == (
        period.end
    )
    assert period_for(window, period.start, timezone=zone, billing_day=billing_day) == period
    limit = {"hour": timedelta(hours=1), "day": timedelta(hours=26), "month": timedelta(days=32)}
    assert period.end - period.start <= limit[window]


@pytest.mark.parametrize("zone", ZONES)
def test_every_transition_of_a_year_keeps_periods_contiguous(zone: str) -> None:
    """Walk 2026 one period at a time: no gap, no overlap, no empty period."""
    for window in ("hour", "day", "month"):
        at, stop = utc(2026, 1, 1), utc(2027, 1, 1)
        while at < stop:
            period = period_for(window, at, timezone=zone, billing_day=31)
            assert period.start <= at < period.end, (window, at, period)  # type: ignore[operator]
            at = period.end  # type: ignore[assignment]


# --- A tenant changing timezone or billing day mid-period ------------------------------------


def _spend(times: int) -> None:
    for _ in range(times):
        hold = reserve_30()
        hold.commit(input_tokens=0, output_tokens=1000)


@pytest.mark.django_db
def test_billing_day_change_cannot_reset_the_budget_early() -> None:
    with time_machine.travel(utc(2026, 11, 10, 12), tick=False):
        seed(limit="100")  # billing day 1, UTC: the period is Nov 1 - Dec 1
        _spend(3)  # 90 of 100
        # Moving the anchor to the 15th would make "now" part of an Oct 15 - Nov 15 period.
        budgets.ensure_tenant(tenant="acme", billing_day=15)
        tenant = Tenant.objects.get()
        assert tenant.calendar_effective_from == utc(2026, 12, 1)
        audit = AuditEvent.objects.filter(action="tenant.update").get()
        assert audit.after == {
            "billing_day": 15,
            "calendar_effective_from": "2026-12-01T00:00:00+00:00",
        }
    for moment in (utc(2026, 11, 10, 13), utc(2026, 11, 20), utc(2026, 11, 30, 23, 59)):
        with time_machine.travel(moment, tick=False), pytest.raises(BudgetExceeded) as info:
            reserve_30()
        assert info.value.resets_at == utc(2026, 12, 1)
    with time_machine.travel(utc(2026, 12, 1), tick=False):
        _spend(3)  # the bridge period Dec 1 - Dec 15 has its own limit
        with pytest.raises(BudgetExceeded) as info:
            reserve_30()
        assert info.value.resets_at == utc(2026, 12, 15)
    with time_machine.travel(utc(2026, 12, 15), tick=False):
        _spend(1)  # the new calendar: Dec 15 - Jan 15
    starts = list(Counter.objects.order_by("period_start").values_list("period_start", flat=True))
    assert starts == [utc(2026, 11, 1), utc(2026, 12, 1), utc(2026, 12, 15)]
    # Nothing lost, nothing counted twice.
    assert sum(Counter.objects.values_list("spent", flat=True)) == Decimal(210)
    assert sum(UsageRecord.objects.values_list("cost", flat=True)) == Decimal(210)
    assert counters_drift() == []


@pytest.mark.django_db
def test_timezone_change_keeps_the_current_period() -> None:
    with time_machine.travel(utc(2026, 11, 30, 12), tick=False):
        seed(limit="100")
        _spend(3)
        # In Kiritimati (UTC+14) it is already Dec 1: under the new zone a fresh month would
        # have begun at 10:00 UTC. The new zone applies from the end of this month instead.
        budgets.ensure_tenant(tenant="acme", timezone="Pacific/Kiritimati")
        with pytest.raises(BudgetExceeded):
            reserve_30()
    with time_machine.travel(utc(2026, 11, 30, 23, 59), tick=False), pytest.raises(BudgetExceeded):
        reserve_30()  # Kiritimati reached Dec 1 at 10:00 UTC; the old month still runs
    with time_machine.travel(utc(2026, 12, 1), tick=False):
        reserve_30().release()
        tenant = Tenant.objects.get()
        # The bridge ends at the next Kiritimati month start: Jan 1 00:00 +14.
        period = tenant_period("month", utc(2026, 12, 1), tenant)
        assert (period.start, period.end) == (utc(2026, 12, 1), utc(2026, 12, 31, 10))


@pytest.mark.django_db
def test_second_change_while_pending_keeps_the_moment_and_reverting_cancels() -> None:
    with time_machine.travel(utc(2026, 11, 10), tick=False):
        seed(limit="100")
        budgets.ensure_tenant(tenant="acme", billing_day=15)
    with time_machine.travel(utc(2026, 11, 20), tick=False):
        budgets.ensure_tenant(tenant="acme", billing_day=20, timezone="Europe/Amsterdam")
        tenant = Tenant.objects.get()
        assert (tenant.previous_billing_day, tenant.previous_timezone) == (1, "UTC")
        assert tenant.calendar_effective_from == utc(2026, 12, 1)
        budgets.ensure_tenant(tenant="acme", billing_day=1, timezone="UTC")
        tenant.refresh_from_db()
        assert tenant.calendar_effective_from is None
        assert period_for("month", utc(2026, 11, 20)) == tenant_period(
            "month", utc(2026, 11, 20), tenant
        )


@pytest.mark.django_db
def test_change_after_the_previous_one_took_effect_starts_from_the_new_calendar() -> None:
    with time_machine.travel(utc(2026, 11, 10), tick=False):
        seed(limit="100")
        budgets.ensure_tenant(tenant="acme", billing_day=15)
    with time_machine.travel(utc(2026, 12, 20), tick=False):
        budgets.ensure_tenant(tenant="acme", billing_day=5)
        tenant = Tenant.objects.get()
        assert tenant.previous_billing_day == 15
        assert tenant.calendar_effective_from == utc(2027, 1, 15)


def test_day_and_hour_windows_switch_zone_at_the_same_moment_as_the_month() -> None:
    tenant = SimpleNamespace(
        timezone="America/New_York",
        billing_day=1,
        previous_timezone="UTC",
        previous_billing_day=1,
        calendar_effective_from=utc(2026, 12, 1),
    )
    # Before the moment: UTC days and hours, even though New York's day differs.
    day = tenant_period("day", utc(2026, 11, 30, 23), tenant)  # type: ignore[arg-type]
    assert (day.start, day.end) == (utc(2026, 11, 30), utc(2026, 12, 1))
    # From it: New York's calendar, its first day cut to start at the moment, not before.
    day = tenant_period("day", utc(2026, 12, 1, 1), tenant)  # type: ignore[arg-type]
    assert (day.start, day.end) == (utc(2026, 12, 1), utc(2026, 12, 1, 5))
    day = tenant_period("day", utc(2026, 12, 1, 5), tenant)  # type: ignore[arg-type]
    assert (day.start, day.end) == (utc(2026, 12, 1, 5), utc(2026, 12, 2, 5))
    hour = tenant_period("hour", utc(2026, 12, 1, 0, 30), tenant)  # type: ignore[arg-type]
    assert (hour.start, hour.end) == (utc(2026, 12, 1), utc(2026, 12, 1, 1))


@settings(max_examples=200, deadline=None)
@given(
    changed_at=st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
    ),
    old=st.tuples(st.sampled_from(ZONES), st.integers(1, 31)),
    new=st.tuples(st.sampled_from(ZONES), st.integers(1, 31)),
    window=st.sampled_from(["hour", "day", "month"]),
)
def test_a_calendar_change_never_shortens_the_running_period_and_periods_still_tile(
    changed_at: datetime, old: tuple[str, int], new: tuple[str, int], window: str
) -> None:
    tenant = Tenant(external_id="t", timezone=old[0], billing_day=old[1])
    _schedule_calendar_change(tenant, {"timezone": new[0], "billing_day": new[1]}, changed_at)
    tenant.timezone, tenant.billing_day = new
    running = period_for(window, changed_at, timezone=old[0], billing_day=old[1])
    # The period running when the change is made keeps its start and its end.
    assert tenant_period(window, changed_at, tenant) == running
    # Walking on from it, periods tile time across the switch: no gap, no overlap.
    at = running.end
    assert at is not None
    for _ in range(3 if window == "month" else 40):
        period = tenant_period(window, at, tenant)
        assert period.start == at, (at, period)
        assert period.end is not None
        assert period.end > at
        at = period.end
