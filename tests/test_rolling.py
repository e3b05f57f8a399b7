"""Rolling windows (issue 4, item 1): buckets, drop-out, Retry-After, cost, concurrency."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from llm_budgets import budgets
from llm_budgets.engine import admission, settlement
from llm_budgets.engine.applicable import applicable_budgets
from llm_budgets.engine.counters import rolling_buckets
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Budget, Counter, Reservation, Tenant, UsageRecord
from llm_budgets.models.budgets import validate_window
from llm_budgets.reads.overviews import tenant_overview
from llm_budgets.windows import period_for, rolling_window, window_name
from tests.concurrency import run_threads
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed
from tests.queries import reads

# Moves time with time_machine: admission follows this process's clock (conftest).
pytestmark = pytest.mark.usefixtures("application_clock")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- Parsing and bucket sizes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "name", "bucket", "buckets"),
    [
        ("rolling:1m", "rolling:1m", timedelta(seconds=1), 60),
        ("rolling:1h", "rolling:1h", timedelta(minutes=1), 60),
        ("rolling:90m", "rolling:90m", timedelta(minutes=1), 90),
        ("rolling:24h", "rolling:1d", timedelta(minutes=15), 96),
        ("rolling:1d", "rolling:1d", timedelta(minutes=15), 96),
        ("rolling:7d", "rolling:7d", timedelta(hours=2), 84),
        ("rolling:168h", "rolling:7d", timedelta(hours=2), 84),
        ("rolling:30d", "rolling:30d", timedelta(hours=12), 60),
        ("rolling:366d", "rolling:366d", timedelta(days=6), 61),
    ],
)
def test_bucket_is_about_a_sixtieth_of_the_window(
    window: str, name: str, bucket: timedelta, buckets: int
) -> None:
    rolling = rolling_window(window)
    assert rolling is not None
    assert (rolling.name, rolling.bucket, rolling.buckets) == (name, bucket, buckets)
    assert window_name(window) == name


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("rolling:", "rolling:<number><unit>"),
        ("rolling:1w", "rolling:<number><unit>"),
        ("rolling:30s", "rolling:<number><unit>"),
        ("rolling:0h", "rolling:<number><unit>"),
        ("rolling:1.5h", "rolling:<number><unit>"),
        ("rolling:367d", "from 1m to 366d"),
        ("rolling:7919m", "7919 buckets .* use a multiple of 2h, e.g. rolling:130h"),
        ("week", "month, day, hour, lifetime or rolling:<duration>"),
    ],
)
def test_bad_windows_are_refused_with_the_field_named(window: str, message: str) -> None:
    with pytest.raises(InvalidUsage, match=message) as info:
        window_name(window)
    assert info.value.field == "window"


def test_buckets_are_aligned_on_the_epoch_and_the_period_is_the_current_bucket() -> None:
    period = period_for("rolling:1d", utc(2026, 11, 29, 20, 7, 13))
    assert (period.start, period.end) == (utc(2026, 11, 29, 20), utc(2026, 11, 29, 20, 15))


@pytest.mark.django_db
def test_set_limit_stores_one_canonical_spelling() -> None:
    seed(window="rolling:24h")
    budgets.set_limit(tenant="acme", amount=Decimal(50), window="rolling:1d")
    budget = Budget.objects.get()
    assert (budget.window, budget.limit) == ("rolling:1d", Decimal(50))


@pytest.mark.django_db
def test_database_refuses_an_unknown_window() -> None:
    with pytest.raises(IntegrityError):
        Budget.objects.create(scope="global", window="fortnight", limit=Decimal(1))


# --- Admission over a window ------------------------------------------------------------------


def _at(moment: datetime) -> time_machine.travel:
    return time_machine.travel(moment, tick=False)


@pytest.mark.django_db
def test_spend_drops_out_bucket_by_bucket_and_retry_after_says_when_it_fits() -> None:
    with _at(utc(2026, 11, 29, 10, 0, 30)):
        seed(limit="100", window="rolling:1h")  # buckets of 1 minute, 60 + the current one
        reserve_30().commit(input_tokens=0, output_tokens=1000)  # 30 in the 10:00 bucket
    with _at(utc(2026, 11, 29, 10, 20)):
        reserve_30().commit(input_tokens=0, output_tokens=500)  # 15 in 10:20
    with _at(utc(2026, 11, 29, 10, 40)):
        reserve_30()  # held: 30 in 10:40
    with _at(utc(2026, 11, 29, 10, 50)), pytest.raises(BudgetExceeded) as info:
        reserve_30()  # 75 used, 25 left: 5 more must leave; the 10:00 bucket goes at 11:01
    refusal = info.value
    assert (refusal.remaining, refusal.requested, refusal.window) == (
        Decimal(25),
        Decimal(30),
        "rolling:1h",
    )
    assert refusal.resets_at == utc(2026, 11, 29, 11, 1)
    assert "It has room for it at 2026-11-29T11:01:00+00:00, as older spend leaves" in str(refusal)
    with _at(utc(2026, 11, 29, 10, 50)):
        assert refusal.retry_after == 11 * 60
    with _at(utc(2026, 11, 29, 11, 0, 59)), pytest.raises(BudgetExceeded):
        reserve_30()  # an exact 60-minute window would already have let go of 10:00:30
    with _at(utc(2026, 11, 29, 11, 1)):
        reserve_30()  # 15 + 30 held: 45 + 30 = 75
    with _at(utc(2026, 11, 29, 11, 2)), pytest.raises(BudgetExceeded) as info:
        reserve_30()  # 75 used: 5 more must leave; the 10:20 bucket (15) goes at 11:21
    assert info.value.resets_at == utc(2026, 11, 29, 11, 21)
    assert counters_drift() == []


@pytest.mark.django_db
def test_a_request_above_the_limit_is_told_no_time_makes_room() -> None:
    with _at(utc(2026, 11, 29, 10, 0)):
        seed(limit="50", window="rolling:1h")
        reserve_30()
        with pytest.raises(BudgetExceeded) as info:
            budgets.reserve(
                tenant="acme",
                provider=FAKE_PROVIDER,
                model=FAKE_MODEL,
                input_tokens=0,
                max_output_tokens=2000,  # 60 > 50: never fits
            )
    # Even an empty window (at 11:01) would not admit it: no time to wait for (issue 25).
    assert info.value.resets_at is None
    assert info.value.beyond_limit
    assert "no reset makes room for it" in str(info.value)


@pytest.mark.django_db
def test_usage_lands_in_the_bucket_of_the_reservation() -> None:
    with _at(utc(2026, 11, 29, 10, 0, 30)):
        seed(limit="100", window="rolling:1h")
        hold = reserve_30()
    with _at(utc(2026, 11, 29, 10, 7)):
        hold.commit(input_tokens=0, output_tokens=400)
    counter = Counter.objects.get()
    assert (counter.period_start, counter.spent, counter.reserved) == (
        utc(2026, 11, 29, 10, 0),
        Decimal(12),
        Decimal(0),
    )
    assert counters_drift() == []


@pytest.mark.django_db
def test_expired_holds_are_charged_in_their_bucket_and_leave_with_it() -> None:
    with _at(utc(2026, 11, 29, 10, 0)):
        seed(limit="60", window="rolling:1h")
        reserve_30(ttl=60)
        reserve_30(ttl=60)
    with _at(utc(2026, 11, 29, 10, 5)):
        assert budgets.sweep() == 2
        with pytest.raises(BudgetExceeded) as info:
            reserve_30()
        assert info.value.resets_at == utc(2026, 11, 29, 11, 1)
    with _at(utc(2026, 11, 29, 11, 1)):
        reserve_30()
    assert counters_drift() == []


@pytest.mark.django_db
def test_calendar_and_rolling_budgets_apply_together() -> None:
    with _at(utc(2026, 11, 29, 10, 0)):
        seed(limit="1000", window="month")
        budgets.set_limit(tenant="acme", amount=Decimal(60), window="rolling:1h")
        reserve_30().commit(input_tokens=0, output_tokens=1000)
        reserve_30().commit(input_tokens=0, output_tokens=1000)
        with pytest.raises(BudgetExceeded) as info:
            reserve_30()
    assert info.value.window == "rolling:1h"
    with _at(utc(2026, 11, 29, 11, 1)):
        reserve_30()
        month, rolling = sorted(budgets.status(tenant="acme"), key=lambda s: s.window)
    assert (month.spent, month.reserved) == (Decimal(60), Decimal(30))
    assert (rolling.spent, rolling.reserved, rolling.remaining) == (
        Decimal(0),
        Decimal(30),
        Decimal(30),
    )
    assert counters_drift() == []


@pytest.mark.django_db
def test_status_reports_the_whole_window() -> None:
    with _at(utc(2026, 11, 29, 10, 0)):
        seed(limit="100", window="rolling:1h")
        reserve_30().commit(input_tokens=0, output_tokens=1000)
    with _at(utc(2026, 11, 29, 10, 30)):
        reserve_30()
        (status,) = budgets.status(tenant="acme")
    assert (status.spent, status.reserved, status.remaining) == (
        Decimal(30),
        Decimal(30),
        Decimal(40),
    )
    assert status.period_start == utc(2026, 11, 29, 9, 30)
    assert status.resets_at == utc(2026, 11, 29, 11, 31)  # when the 10:30 hold has left too
    with _at(utc(2026, 11, 29, 11, 31)):
        (status,) = budgets.status(tenant="acme")
    assert (status.spent, status.reserved, status.resets_at) == (Decimal(0), Decimal(0), None)


@pytest.mark.django_db
def test_end_user_rolling_budget_replaces_the_default_for_the_same_window() -> None:
    with _at(utc(2026, 11, 29, 10, 0)):
        seed(limit="1000")
        budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(30), window="rolling:24h")
        budgets.set_limit(tenant="acme", end_user="vip", amount=Decimal(90), window="rolling:1d")
        reserve_30(end_user="bob")
        with pytest.raises(BudgetExceeded):
            reserve_30(end_user="bob")
        reserve_30(end_user="alice")  # "*" caps each end user's own window
        for _ in range(3):
            reserve_30(end_user="vip")
    with _at(utc(2026, 11, 29, 10, 30)):
        (bob,) = [s for s in budgets.status(tenant="acme", end_user="bob") if s.scope != "tenant"]
    assert (bob.reserved, bob.remaining) == (Decimal(30), Decimal(0))
    assert counters_drift() == []


# --- Cost: proportional to buckets, never to ledger lines --------------------------------------


def _admission_queries() -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        hold = reserve_30()
    hold.release()
    return [q["sql"] for q in queries.captured_queries]


@pytest.mark.django_db
def test_admission_cost_does_not_grow_with_the_ledger() -> None:
    with _at(utc(2026, 11, 29, 10, 0, 30)):
        seed(limit="100000", window="rolling:1h")
        reserve_30().release()  # the current bucket's counter exists from here on
        before = _admission_queries()
        for _ in range(40):
            reserve_30().commit(input_tokens=0, output_tokens=1000)
        after = _admission_queries()
    assert len(after) == len(before)
    assert not any(reads(sql, UsageRecord) for sql in after)


@pytest.mark.django_db
def test_the_window_query_reads_at_most_a_window_of_buckets() -> None:
    start = utc(2026, 11, 29, 10, 0)
    with _at(start):
        seed(limit="100000", window="rolling:1h")
    for minute in range(0, 180, 2):  # 90 buckets over three hours
        with _at(start + timedelta(minutes=minute)):
            reserve_30().commit(input_tokens=0, output_tokens=1000)
    end = start + timedelta(minutes=180)
    with _at(end):
        (status,) = budgets.status(tenant="acme")
        tenant = Tenant.objects.get()
        window = rolling_buckets(applicable_budgets(tenant, None, end))
    # 61 buckets counted (12:00 to 13:00); one spend every other minute from 12:00 on.
    assert status.spent == Decimal(30) * 30
    assert Counter.objects.count() == 90
    (buckets,) = window.values()
    assert len(buckets) == 30
    assert min(b.start for b in buckets) == utc(2026, 11, 29, 12, 0)


# --- Concurrency: real threads, each on its own connection ------------------------------------

NOW = utc(2026, 11, 29, 10, 0, 59, 500000)


def _reserve_at(moment: datetime) -> str:
    try:
        admission.reservation_create(
            tenant="acme",
            provider=FAKE_PROVIDER,
            model=FAKE_MODEL,
            input_tokens=0,
            max_output_tokens=1000,
            now=moment,
        )
    except BudgetExceeded:
        return "refused"
    return "admitted"


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_threads_admit_exactly_what_fits_in_the_window() -> None:
    with _at(NOW - timedelta(hours=1)):
        seed(limit="100", window="rolling:1h")
    results = run_threads(20, lambda _: _reserve_at(NOW))
    assert results.count("admitted") == 3, results
    assert sum(Counter.objects.values_list("reserved", flat=True)) == Decimal(90)


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_threads_across_a_bucket_boundary_never_overspend() -> None:
    """Half the threads see 10:00:59.5, half 10:01:00.5 (two buckets, two counters): they all
    serialise on the budget row, and each counts every bucket from its window's start on."""
    with _at(NOW - timedelta(hours=1)):
        seed(limit="100", window="rolling:1h")
    moments = [NOW, NOW + timedelta(seconds=1)]
    results = run_threads(20, lambda i: _reserve_at(moments[i % 2]))
    assert results.count("admitted") == 3, results
    assert sum(Counter.objects.values_list("reserved", flat=True)) == Decimal(90)
    assert Reservation.objects.count() == 3
    assert counters_drift() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_a_late_clock_still_counts_a_newer_bucket() -> None:
    """A request whose clock is a minute behind lands in an older bucket; it must still count
    the holds already taken in the newer one, or the newer window would go over."""
    with _at(NOW - timedelta(hours=1)):
        seed(limit="100", window="rolling:1h")
    moments = [NOW - timedelta(minutes=1), NOW, NOW + timedelta(minutes=1)]
    results = run_threads(21, lambda i: _reserve_at(moments[i % 3]))
    assert results.count("admitted") == 3, results
    assert sum(Counter.objects.values_list("reserved", flat=True)) == Decimal(90)


# --- The cap is hard over any interval of the window's length ---------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("seed_value", [1, 2, 3])
def test_no_interval_of_the_window_length_holds_more_than_the_limit(seed_value: int) -> None:
    """Random admissions over three hours, some committed below their hold, some released: in
    every 60-minute interval (not only bucket-aligned ones) admitted spend stays within 100."""
    rng = random.Random(seed_value)
    start = utc(2026, 11, 29, 10, 0)
    with _at(start):
        seed(limit="100", window="rolling:1h")
    moments = sorted(start + timedelta(seconds=rng.randrange(3 * 3600)) for _ in range(120))
    for moment in moments:
        with _at(moment):
            try:
                hold = reserve_30()
            except BudgetExceeded:
                continue
            outcome = rng.random()
            if outcome < 0.6:
                hold.commit(input_tokens=0, output_tokens=rng.randrange(1001))
            elif outcome < 0.8:
                hold.release()
    admitted = [
        (
            r.created_at,
            r.amount if r.state == "held" else sum(u.cost for u in r.usage_records.all()),
        )
        for r in Reservation.objects.prefetch_related("usage_records")
    ]
    assert len(admitted) >= 8
    for begin, _ in admitted:
        in_window = [amount for at, amount in admitted if begin <= at < begin + timedelta(hours=1)]
        assert sum(in_window) <= Decimal(100), (begin, in_window)
    assert counters_drift() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_reserving_settling_and_creating_buckets_together_never_deadlocks() -> None:
    """Threads on both sides of bucket boundaries reserve, commit, release and expire at once,
    with a calendar and two rolling budgets applying: no deadlock, no drift, no overspend."""
    with _at(NOW - timedelta(hours=1)):
        seed(limit="100000", window="month")
        budgets.set_limit(tenant="acme", amount=Decimal(600), window="rolling:1h")
        budgets.set_limit(amount=Decimal(100000), window="rolling:2h")  # global, 2 min buckets

    def cycle(index: int) -> str:
        for step in range(6):
            moment = NOW + timedelta(seconds=index + 7 * step)
            try:
                reservation = admission.reservation_create(
                    tenant="acme",
                    provider=FAKE_PROVIDER,
                    model=FAKE_MODEL,
                    input_tokens=0,
                    max_output_tokens=1000,
                    now=moment,
                    ttl=1,
                )
            except BudgetExceeded:
                continue
            if step % 3 == 0:
                settlement.reservation_commit(
                    reservation.pk, input_tokens=0, output_tokens=500, now=moment
                )
            elif step % 3 == 1:
                settlement.reservation_release(reservation.pk, now=moment)
            else:
                settlement.reservations_sweep(now=moment + timedelta(seconds=2))
        return "ok"

    threads = 8 if connection.vendor == "postgresql" else 4  # SQLite: one writer at a time
    assert run_threads(threads, cycle) == ["ok"] * threads
    assert counters_drift() == []
    tenant_rolling = Budget.objects.get(window="rolling:1h")
    assert sum(tenant_rolling.counters.values_list("spent", flat=True)) <= Decimal(600)


def test_model_validation_names_the_canonical_spelling() -> None:
    with pytest.raises(ValidationError, match="Write 'rolling:24h' as 'rolling:1d'"):
        validate_window("rolling:24h")
    with pytest.raises(ValidationError, match="rolling:<number><unit>"):
        validate_window("rolling:1w")
    validate_window("rolling:1d")
    validate_window("month")


@pytest.mark.django_db
def test_admin_tenant_page_shows_an_end_users_rolling_window() -> None:
    start = utc(2026, 11, 29, 10, 0)
    with _at(start):
        seed(limit="1000")
        budgets.set_limit(tenant="acme", end_user="vip", amount=Decimal(100), window="rolling:1h")
        reserve_30(end_user="vip").commit(input_tokens=0, output_tokens=1000)
    with _at(start + timedelta(minutes=30)):
        reserve_30(end_user="vip")
    overview = tenant_overview(Tenant.objects.get(), start + timedelta(minutes=45))
    (own,) = overview.end_user_budgets
    assert (own.window, own.spent, own.reserved, own.remaining) == (
        "rolling:1h",
        Decimal(30),
        Decimal(30),
        Decimal(40),
    )
    assert own.resets_at == start + timedelta(minutes=91)
