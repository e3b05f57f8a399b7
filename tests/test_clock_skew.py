"""Clock trouble (issue #17, item 4): a web process whose clock is minutes off cannot widen a
window, reset a period early or give its holds an expiry off by its skew, because admission
reads the time from the database (``llm_budgets.db.dbclock``).

Each test forks a process whose clock ``time_machine`` moves (10 minutes past the boundary of
the database's current hour period, 10 minutes before its start, or an hour either way); this
process, on the database's clock, is the normal one. On both databases (SQLite's clock is the
operating system's, read by SQLite's C code, which ``time_machine`` does not move).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.db.dbclock import database_now
from llm_budgets.engine import settlement
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import Counter, Reservation
from llm_budgets.windows import Period, period_for
from tests.concurrency import overspent_counters, run_processes
from tests.factories import reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]

TTL = 120
# Hour periods of these zones start at :00, :30 and :45 past the UTC hour: at any moment one of
# them has more than a few minutes left, so the database's clock stays in the period chosen.
ZONES = ("UTC", "Asia/Kolkata", "Asia/Kathmandu")


def _tenant_with_room_left() -> Period:
    """Seed a tenant capped at 60 an hour in a zone whose current hour period (by the
    database's clock) has at least three minutes left; return that period."""
    now = database_now()
    for zone in ZONES:
        period = period_for("hour", now, timezone=zone)
        if period.end - now >= timedelta(minutes=3):
            budgets.ensure_tenant(tenant="acme", timezone=zone)
            seed(limit="60", window="hour")
            return period
    raise AssertionError("unreachable: the zones' hour boundaries are 15 minutes apart or more")


def _skews(period: Period) -> dict[str, timedelta]:
    now = database_now()
    return {
        "10 minutes past the period's end": period.end - now + timedelta(minutes=10),
        "10 minutes before the period's start": period.start - now - timedelta(minutes=10),
        "an hour ahead": timedelta(hours=1),
        "an hour behind": -timedelta(hours=1),
    }


def _skewed(skew: timedelta, end_user: str | None) -> Callable[[int], dict[str, Any]]:
    """Work for a forked process whose clock is ``skew`` off: reserve 30, as a web process
    would (no explicit time), and say what happened."""

    def work(_: int) -> dict[str, Any]:
        with time_machine.travel(datetime.now(UTC) + skew, tick=True):
            app_now = timezone.now()
            try:
                hold = reserve_30(end_user=end_user, ttl=TTL)
            except BudgetExceeded as exc:
                return {"outcome": "refused", "resets_at": exc.resets_at, "app_now": app_now}
            reservation = Reservation.objects.get(pk=hold.reservation.pk)
            return {
                "outcome": "admitted",
                "app_now": app_now,
                "pk": reservation.pk,
                "created_at": reservation.created_at,
                "expires_at": reservation.expires_at,
            }

    return work


def _in_skewed_process(skew: timedelta, end_user: str | None) -> dict[str, Any]:
    [(status, value)] = run_processes(1, _skewed(skew, end_user))
    assert status == "ok", value
    return value  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("which", "end_user"),
    [
        # The known end user's call reads the clock in its context read; the call without
        # one reads it on its own: both paths.
        ("10 minutes past the period's end", "u-1"),
        ("10 minutes before the period's start", "u-1"),
        ("an hour ahead", None),
        ("an hour behind", None),
    ],
)
def test_a_skewed_process_admits_into_the_databases_period_only(
    which: str, end_user: str | None
) -> None:
    period = _tenant_with_room_left()
    skew = _skews(period)[which]
    if end_user is not None:
        reserve_30(end_user=end_user).release()  # a known end user: the one-read path
    full = [reserve_30(end_user=end_user, ttl=TTL), reserve_30(end_user=end_user, ttl=TTL)]

    # The period is full. Ahead, the process's clock says the next period has begun (a reset
    # the database has not reached: a double reset if admitted); behind, that the previous one
    # is still open (a widened window if admitted). Either way: refused, with the database's
    # period's end as the time it resets.
    refused = _in_skewed_process(skew, end_user)
    assert refused["outcome"] == "refused", refused
    assert abs(refused["app_now"] - database_now() - skew) < timedelta(minutes=1)  # it was off
    assert refused["resets_at"] == period.end
    assert not Counter.objects.exclude(period_start=period.start).filter(reserved__gt=0).exists()

    # With room again, its hold lands in the database's period and expires by the database's
    # clock: neither early (behind) nor late (ahead) by the skew.
    full[0].release()
    before = database_now()
    admitted = _in_skewed_process(skew, end_user)
    after = database_now()
    assert admitted["outcome"] == "admitted", admitted
    reservation = Reservation.objects.get(pk=admitted["pk"])
    assert {h.counter.period_start for h in reservation.holds.select_related("counter")} == {
        period.start
    }
    assert before - timedelta(seconds=1) <= admitted["created_at"] <= after
    assert admitted["expires_at"] == admitted["created_at"] + timedelta(seconds=TTL)
    assert admitted["expires_at"] > database_now()  # not due for the sweep yet
    assert Counter.objects.get(period_start=period.start).reserved == Decimal(60)
    assert overspent_counters() == []
    full[1].release()


def test_a_skewed_process_extends_a_hold_by_the_databases_clock() -> None:
    """An hour ahead, ``extend`` would push a hold an hour past what was asked."""
    _tenant_with_room_left()
    hold = reserve_30(ttl=TTL)

    def extend(_: int) -> datetime:
        with time_machine.travel(datetime.now(UTC) + timedelta(hours=1), tick=True):
            return settlement.reservation_extend(hold.id, ttl=300).expires_at

    before = database_now()
    [(status, expires_at)] = run_processes(1, extend)
    after = database_now()
    assert status == "ok", expires_at
    assert before + timedelta(seconds=300) <= expires_at + timedelta(seconds=1)
    assert expires_at <= after + timedelta(seconds=300)
    assert Reservation.objects.get(pk=hold.id).expires_at == expires_at
