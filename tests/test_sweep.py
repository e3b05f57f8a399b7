"""The batched expiry sweep (issue 15 part 4, issue 17 item 4): overdue on the database's clock,
one transaction per batch, exactly once against commits and releases racing it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from uuid import UUID

import pytest
import time_machine
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.engine.settlement import (
    CommitResult,
    reservation_commit,
    reservations_sweep,
)
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    BillingLine,
    Counter,
    Reservation,
    ReservationState,
    UsageKind,
    UsageRecord,
)
from tests.concurrency import overspent_counters, patient_lock_waits, run_threads
from tests.factories import reserve_30, reserve_30_at, seed


def _overdue(count: int, *, end_user: str | None = None) -> list[UUID]:
    """``count`` holds of 30 that expired an hour ago (on every clock)."""
    an_hour_ago = timezone.now() - timedelta(hours=1)
    scopes = {"end_user": end_user} if end_user else {}
    return [reserve_30_at(an_hour_ago, ttl=60, **scopes).pk for _ in range(count)]  # type: ignore[attr-defined]


def _states(ids: list[UUID]) -> list[str]:
    found = dict(Reservation.objects.filter(pk__in=ids).values_list("pk", "state"))
    return [found[pk] for pk in ids]


@pytest.mark.django_db
def test_a_sweeper_whose_clock_runs_ahead_expires_nothing_early() -> None:
    # Issue 17 item 4: the process's clock is an hour ahead (time_machine moves Python's clock,
    # not the database server's, nor SQLite's, which reads the C library's), so by its own
    # clock every live hold is overdue: the sweep must read "overdue" on the database's clock.
    seed(limit="1000")
    live = reserve_30(ttl=600)
    overdue = _overdue(1)
    with time_machine.travel(timezone.now() + timedelta(hours=1), tick=True):
        assert reservations_sweep() == 1
    assert _states([live.id, *overdue]) == [ReservationState.HELD, ReservationState.EXPIRED]


@pytest.mark.django_db
def test_a_sweeper_whose_clock_runs_behind_still_expires_what_is_overdue() -> None:
    # The other direction: the process's clock is two hours behind, the hold expired an hour
    # ago on the database's clock: it is expired, and its line is stamped with the database's
    # time, not the process's.
    seed(limit="1000")
    overdue = _overdue(1)
    started = timezone.now()
    with time_machine.travel(started - timedelta(hours=2), tick=True):
        assert reservations_sweep() == 1
    line = UsageRecord.objects.get()
    assert line.created_at >= started - timedelta(minutes=5)
    assert _states(overdue) == [ReservationState.EXPIRED]


@pytest.mark.django_db
def test_the_sweep_asks_the_database_for_the_time() -> None:
    seed(limit="1000")
    _overdue(1)
    clock = "statement_timestamp()" if connection.vendor == "postgresql" else "'now'"
    with CaptureQueriesContext(connection) as queries:
        reservations_sweep()
    due = [
        q["sql"]
        for q in queries.captured_queries
        if "SKIP LOCKED" in q["sql"] or "LIMIT" in q["sql"]
    ]
    assert due
    assert all(clock in text for text in due), due


@pytest.mark.django_db
def test_a_batch_is_one_transaction_with_set_based_writes() -> None:
    # 40 holds on the same counters: a batch writes the states, the lines and each counter
    # once, not once per hold.
    seed(limit="10000", window="lifetime")
    ids = _overdue(40, end_user="u1")
    with CaptureQueriesContext(connection) as queries:
        assert reservations_sweep(batch_size=100) == 40
    assert len(queries.captured_queries) < 15, [q["sql"][:80] for q in queries.captured_queries]
    assert _states(ids) == [ReservationState.EXPIRED] * 40
    assert UsageRecord.objects.filter(kind=UsageKind.CHARGE, is_estimated=True).count() == 40
    for counter in Counter.objects.all():
        assert (counter.spent, counter.reserved) == (Decimal(1200), 0)
    assert counters_drift() == []


@pytest.mark.django_db
@override_settings(LLM_BUDGETS={"EXPIRED_HOLD_POLICY": "release"})
def test_the_release_policy_drops_a_batch_without_a_line() -> None:
    seed(limit="10000", window="lifetime")
    ids = _overdue(7)
    assert reservations_sweep(batch_size=3) == 7
    assert _states(ids) == [ReservationState.EXPIRED] * 7
    assert UsageRecord.objects.count() == 0
    assert (Counter.objects.get().spent, Counter.objects.get().reserved) == (0, 0)
    # A late commit charges in full (the policy's rule, unchanged by batching).
    reservation_commit(ids[0], input_tokens=0, output_tokens=200)
    assert Counter.objects.get().spent == Decimal(6)
    assert counters_drift() == []


@pytest.mark.django_db
def test_uncertain_holds_are_left_to_the_reconcile_job() -> None:
    seed(limit="10000", window="lifetime")
    ids = _overdue(3)
    budgets.mark_uncertain(ids[1])
    assert reservations_sweep() == 2
    assert _states(ids) == [
        ReservationState.EXPIRED,
        ReservationState.UNCERTAIN,
        ReservationState.EXPIRED,
    ]
    assert Counter.objects.get().reserved == Decimal(30)
    assert counters_drift() == []


@pytest.mark.django_db
def test_a_batch_bills_each_estimate_once_for_linked_tenants_only() -> None:
    from llm_budgets.billing.outbox import linked_cache_clear

    seed(limit="10000", window="lifetime")
    seed(limit="10000", tenant="other", window="lifetime")
    budgets.link_stripe_customer(tenant="acme", customer_id="cus_acme")
    linked_cache_clear()
    mine = _overdue(3)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    theirs = [reserve_30_at(an_hour_ago, tenant="other", ttl=60).pk for _ in range(2)]  # type: ignore[attr-defined]
    assert reservations_sweep() == 5
    rows = BillingLine.objects.order_by("reservation_id")
    assert sorted(r.reservation_id for r in rows) == sorted(mine)
    assert {(r.kind, r.amount, r.customer_id) for r in rows} == {
        (UsageKind.CHARGE, Decimal(30), "cus_acme")
    }
    assert UsageRecord.objects.filter(reservation_id__in=theirs).count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_batches_racing_commits_settle_each_hold_exactly_once() -> None:
    # 60 overdue holds; 6 threads commit 10 each (actual cost 15, below the hold of 30) while 3
    # sweepers run in batches of 7. Whoever locks a hold first wins: a commit after the expiry
    # trues the estimate down, a sweep never expires a committed hold, and nothing is counted
    # twice or lost.
    seed(limit="100000", window="lifetime")
    ids = _overdue(60)

    def work(i: int) -> object:
        if i >= 6:
            return reservations_sweep(batch_size=7)
        return [reservation_commit(rid, input_tokens=0, output_tokens=500) for rid in ids[i::6]]

    with patient_lock_waits():
        results = run_threads(9, work)

    assert all(not isinstance(r, BaseException) for r in results), results
    swept = sum(r for r in results[6:] if isinstance(r, int))
    commits = [c for r in results[:6] for c in r]  # type: ignore[union-attr]
    assert all(isinstance(c, CommitResult) and c.cost == Decimal(15) for c in commits)
    assert _states(ids) == [ReservationState.COMMITTED] * 60
    estimates = UsageRecord.objects.filter(kind=UsageKind.CHARGE, is_estimated=True)
    assert swept == estimates.count()
    assert UsageRecord.objects.filter(kind=UsageKind.TRUE_UP).count() == swept
    for rid in ids:
        lines = UsageRecord.objects.filter(reservation_id=rid)
        assert sum((line.cost for line in lines), Decimal(0)) == Decimal(15)
    counter = Counter.objects.get()
    assert (counter.spent, counter.reserved) == (Decimal(15 * 60), 0)
    assert counters_drift() == []
    assert overspent_counters() == []


@pytest.mark.django_db
def test_a_batch_writes_the_same_estimate_line_as_expiring_one_hold() -> None:
    # The batch builds its lines in SQL from the reservation rows: the same line, field by
    # field, as reservation_expire builds in Python (tags, run and price version included).
    from llm_budgets.engine.settlement import reservation_expire

    seed(limit="10000", window="lifetime")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("1000"), window="lifetime")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    one, other = (
        reserve_30_at(an_hour_ago, ttl=60, run="r-1", tags={"project": "alpha"}).pk  # type: ignore[attr-defined]
        for _ in range(2)
    )
    moment = timezone.now()
    assert reservation_expire(one, now=moment) is True
    assert reservations_sweep(now=moment) == 1
    ignored = {"id", "reservation", "created_at"}
    names = [f.attname for f in UsageRecord._meta.concrete_fields if f.name not in ignored]
    first, second = (
        UsageRecord.objects.filter(reservation_id=rid).values(*names).get() for rid in (one, other)
    )
    assert first == second
    assert first["tags"] == {"project": "alpha"}
    assert first["run_id"] is not None
    assert first["is_estimated"] is True


@pytest.mark.django_db
def test_a_batch_never_sends_more_parameters_than_the_database_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SQLite's statements name a batch's ids as parameters: the batch is cut to what the
    # database accepts (Django's max_query_params), whatever batch_size says.
    if connection.features.max_query_params is None:
        pytest.skip("PostgreSQL names no ids in a batch's statement")
    # A class attribute in place of the feature (a read-only property on Django 6.1, a plain or
    # cached value before): the instance's cached value, if any, is set aside too.
    monkeypatch.delitem(connection.features.__dict__, "max_query_params", raising=False)
    monkeypatch.setattr(type(connection.features), "max_query_params", 5)
    seed(limit="10000", window="lifetime")
    ids = _overdue(7)
    with CaptureQueriesContext(connection) as queries:
        assert reservations_sweep(batch_size=100) == 7
    assert _states(ids) == [ReservationState.EXPIRED] * 7
    # Batches of 3 (5 parameters less the state and the time): 3, 3, then 1.
    assert len([q for q in queries.captured_queries if "LIMIT 3" in q["sql"]]) == 3
