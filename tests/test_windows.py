"""Periods per window (issue 2): months anchored on the billing day in the tenant's timezone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llm_budgets.windows import LIFETIME_START, period_for


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_global_month_is_the_utc_calendar_month() -> None:
    period = period_for("month", utc(2026, 11, 29, 19, 0))
    assert (period.start, period.end) == (utc(2026, 11, 1), utc(2026, 12, 1))


def test_month_starts_on_the_billing_day_at_local_midnight() -> None:
    # Amsterdam is UTC+1 in winter: local midnight of the 15th is 23:00 UTC on the 14th.
    period = period_for("month", utc(2026, 11, 20, 12), timezone="Europe/Amsterdam", billing_day=15)
    assert (period.start, period.end) == (utc(2026, 11, 14, 23), utc(2026, 12, 14, 23))


def test_before_the_billing_day_the_period_began_last_month() -> None:
    period = period_for("month", utc(2026, 11, 10), billing_day=15)
    assert (period.start, period.end) == (utc(2026, 10, 15), utc(2026, 11, 15))


def test_a_moment_is_in_its_local_month_not_its_utc_month() -> None:
    # 23:30 UTC on Nov 30 is already Dec 1 in Amsterdam.
    period = period_for("month", utc(2026, 11, 30, 23, 30), timezone="Europe/Amsterdam")
    assert period.start == utc(2026, 11, 30, 23)


@pytest.mark.parametrize(
    ("at", "start", "end"),
    [
        (utc(2026, 2, 27), utc(2026, 1, 31), utc(2026, 2, 28)),  # Feb has no 31st: clamp
        (utc(2026, 2, 28), utc(2026, 2, 28), utc(2026, 3, 31)),
        (utc(2026, 4, 30, 12), utc(2026, 4, 30), utc(2026, 5, 31)),
        (utc(2026, 12, 31, 12), utc(2026, 12, 31), utc(2027, 1, 31)),  # across the year end
    ],
)
def test_billing_day_31_clamps_to_short_months(
    at: datetime, start: datetime, end: datetime
) -> None:
    period = period_for("month", at, billing_day=31)
    assert (period.start, period.end) == (start, end)


def test_day_is_the_local_day() -> None:
    period = period_for("day", utc(2026, 7, 1, 22, 30), timezone="Europe/Amsterdam")  # UTC+2
    assert (period.start, period.end) == (utc(2026, 7, 1, 22), utc(2026, 7, 2, 22))


def test_hour_follows_half_hour_zones() -> None:
    period = period_for("hour", utc(2026, 7, 1, 10, 15), timezone="Asia/Kolkata")  # UTC+5:30
    assert (period.start, period.end) == (utc(2026, 7, 1, 9, 30), utc(2026, 7, 1, 10, 30))


def test_lifetime_never_ends() -> None:
    period = period_for("lifetime", utc(2026, 7, 1))
    assert (period.start, period.end) == (LIFETIME_START, None)


def test_unknown_window_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown window 'week'"):
        period_for("week", utc(2026, 7, 1))
