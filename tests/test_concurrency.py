"""Admission and settlement under real concurrency (issue items D3, D9, D11 and invariant 3):
threads released together by a barrier, each on its own database connection, on PostgreSQL and
on SQLite. After every race the ledger must conserve (``counters_drift() == []``) and no counter
may be past its limit. Every test runs twice: with each budget's counter one row, and with every
budget hot (issue #15: its counter split into stripes, docs/design/hot-caps.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control import limits
from llm_budgets.engine.settlement import CommitResult, reservations_sweep
from llm_budgets.exceptions import BudgetExceeded, ReservationStateError
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    Budget,
    Counter,
    EndUser,
    Refusal,
    Reservation,
    ReservationHold,
    ReservationState,
    UsageKind,
    UsageRecord,
)
from tests.concurrency import (
    overspent_counters,
    patient_lock_waits,
    refused_early,
    run_threads,
    worst_case,
)
from tests.factories import price_fake, reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    with patient_lock_waits():
        yield


@pytest.fixture(autouse=True, params=["one row", "hot", "hot, default stripes"])
def caps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``hot``: every budget the test sets is hot, split into 4 stripes (fewer than the racing
    threads, so calls find every stripe busy and wait for one, or take the exact path);
    ``hot, default stripes``: hot with the stripes a host gets by default (issue #26)."""
    if request.param == "one row":
        yield
        return
    set_limit = limits.budget_set_limit

    def hot_set_limit(**kwargs: Any) -> Any:
        kwargs["hot"] = True
        if request.param == "hot":
            kwargs["stripes"] = 4
        return set_limit(**kwargs)

    monkeypatch.setattr(limits, "budget_set_limit", hot_set_limit)
    yield
    # The race really ran on split counters.
    assert not Budget.objects.filter(hot=False).exists()
    assert Counter.objects.filter(stripe__gt=0).exists()


def _counter(**where: Any) -> SimpleNamespace:
    """The one counter matching ``where``: spent and reserved, a hot cap's stripes summed."""
    rows = list(Counter.objects.filter(**where))
    keys = {(c.budget_id, c.end_user_id, c.run_id, c.api_key_id, c.period_start) for c in rows}
    assert len(keys) == 1, rows
    return SimpleNamespace(
        spent=sum((c.spent for c in rows), Decimal(0)),
        reserved=sum((c.reserved for c in rows), Decimal(0)),
    )


class ProviderFailed(Exception):
    """The fake provider call failed: it produced nothing."""


def _admitted(results: list[object]) -> list[budgets.Hold]:
    unexpected = [r for r in results if not isinstance(r, budgets.Hold | BudgetExceeded)]
    assert not unexpected, unexpected
    return [r for r in results if isinstance(r, budgets.Hold)]


def _shared_caps(*, total: int, tenants: int, per_tenant: int, users: int, per_user: int) -> None:
    """A global month cap over tenants t0.. (day caps), each with end users u0.. that have their
    own day caps. Every call's worst case is 30."""
    price_fake()
    budgets.set_limit(amount=Decimal(total), window="month")
    for t in range(tenants):
        budgets.ensure_tenant(tenant=f"t{t}")
        budgets.set_limit(tenant=f"t{t}", amount=Decimal(per_tenant), window="day")
        for u in range(users):
            budgets.set_limit(
                tenant=f"t{t}", end_user=f"u{u}", amount=Decimal(per_user), window="day"
            )


def _assert_ledger_consistent() -> None:
    assert counters_drift() == []
    assert overspent_counters() == []


def test_first_requests_of_a_new_end_user_respect_its_default_limit() -> None:
    # D9: 20 concurrent first requests of an unknown end user under a "*" limit of 100.
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(100), window="day")

    results = run_threads(20, lambda _: reserve_30(end_user="new-user"))

    assert len(_admitted(results)) == 3, results
    assert EndUser.objects.filter(tenant__external_id="acme", external_id="new-user").count() == 1
    assert _counter().reserved == Decimal(90)
    _assert_ledger_consistent()


def test_each_new_end_user_gets_its_own_default_limit() -> None:
    # "*" caps each end user, not their sum: two new users racing each get exactly 3.
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(100), window="day")

    results = run_threads(20, lambda i: reserve_30(end_user=f"new-{i % 2}"))

    _admitted(results)
    per_user = [isinstance(r, budgets.Hold) for r in results]
    assert (sum(per_user[0::2]), sum(per_user[1::2])) == (3, 3), results
    _assert_ledger_consistent()


def test_many_tenants_and_users_never_pass_any_cap() -> None:
    # Global 300 (10 calls of 30); 4 tenants of 120 (4 each); 3 users per tenant of 60 (2 each).
    # 40 callers, 10 per tenant, 3 or 4 per user: whatever the order, only the global cap can
    # be the one that stops admission, so exactly 10 are admitted.
    _shared_caps(total=300, tenants=4, per_tenant=120, users=3, per_user=60)

    results = run_threads(40, lambda i: reserve_30(tenant=f"t{i % 4}", end_user=f"u{i // 4 % 3}"))

    admitted = _admitted(results)
    assert len(admitted) == 10, results
    assert Reservation.objects.count() == 10
    # All or none: every admitted call holds global, tenant and end-user counters.
    assert ReservationHold.objects.count() == 30
    for hold in admitted:
        assert hold.reservation.holds.count() == 3
    assert _counter(budget__scope="global").reserved == Decimal(300)
    _assert_ledger_consistent()


def test_churn_under_shared_caps_never_shows_a_counter_past_its_limit() -> None:
    # Workers reserve, then commit below the hold or release, while a watcher samples every
    # counter against its limit (no call runs over, so no overage is allowed anywhere).
    _shared_caps(total=150, tenants=3, per_tenant=90, users=2, per_user=45)
    workers, rounds = 12, 6
    done = threading.Semaphore(0)
    over: list[str] = []

    def work(index: int) -> Decimal | list[str]:
        if index == workers:
            finished = 0
            while finished < workers:
                over.extend(overspent_counters())
                finished += done.acquire(timeout=0.01)
            return over
        charged = Decimal(0)
        try:
            for n in range(rounds):
                try:
                    hold = reserve_30(tenant=f"t{index % 3}", end_user=f"u{index // 3 % 2}")
                except BudgetExceeded:
                    continue
                if (index + n) % 3 == 0:
                    hold.release()
                else:
                    charged += hold.commit(input_tokens=0, output_tokens=100 * n).cost
            return charged
        finally:
            done.release()

    results = run_threads(workers + 1, work)

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert over == []
    total = sum(r for r in results[:workers] if isinstance(r, Decimal))
    assert _counter(budget__scope="global").spent == total
    assert _counter(budget__scope="global").reserved == 0
    _assert_ledger_consistent()


def test_racing_tiny_calls_committed_at_the_tolerance_never_pass_the_cap() -> None:
    """Issue #38 under concurrency: 16 threads each reserve one-token calls and commit each at
    the input tolerance (257 input tokens, within the rule) until refused. Every commit costs
    exactly its hold, so the cap admits exactly ``floor(cap / hold)`` calls in all, whatever the
    interleaving; no commit runs over, and no refusal is early by the worst case with the
    tolerance."""
    rates = {"input_per_mtok": Decimal("2.5"), "output_per_mtok": Decimal(10)}  # gpt-4o's
    budgets.set_price(provider="openai", model="gpt-4o", **rates)
    held = worst_case(input_tokens=1, max_output_tokens=1, **rates)
    assert held == Decimal("0.0006525")
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=held * 10 + held / 2, window="month")

    def work(_: int) -> tuple[int, BudgetExceeded]:
        calls = 0
        while True:
            try:
                hold = budgets.reserve(
                    tenant="acme",
                    provider="openai",
                    model="gpt-4o",
                    input_tokens=1,
                    max_output_tokens=1,
                )
            except BudgetExceeded as refusal:
                return calls, refusal
            assert hold.commit(input_tokens=257, output_tokens=1).overage == 0
            calls += 1

    results = run_threads(16, work)

    assert all(isinstance(r, tuple) for r in results), results
    assert sum(calls for calls, _ in results) == 10
    assert [r for _, r in results if refused_early(r, held)] == []
    counter = _counter()
    assert (counter.spent, counter.reserved) == (held * 10, 0)
    assert not UsageRecord.objects.filter(overage__gt=0).exists()
    _assert_ledger_consistent()


def test_concurrent_commits_of_one_hold_charge_once() -> None:
    seed(limit="100")
    hold = reserve_30()

    # Each caller reports different usage: the first commit wins, every caller sees its result.
    results = run_threads(10, lambda i: budgets.commit(hold.id, input_tokens=0, output_tokens=i))

    assert all(isinstance(r, CommitResult) for r in results), results
    assert len(set(results)) == 1, results
    line = UsageRecord.objects.get()
    assert line.cost == results[0].cost
    counter = _counter()
    assert (counter.spent, counter.reserved) == (line.cost, Decimal(0))
    assert Reservation.objects.get().state == ReservationState.COMMITTED
    _assert_ledger_consistent()


def test_commit_release_and_sweep_racing_end_each_hold_in_one_state() -> None:
    seed(limit="1000")
    holds = [reserve_30(ttl=60) for _ in range(10)]
    overdue = timezone.now() + timedelta(minutes=5)

    def work(i: int) -> object:
        hold, action = holds[i // 3], i % 3
        if action == 0:
            return budgets.commit(hold.id, input_tokens=0, output_tokens=500)
        if action == 1:
            return budgets.release(hold.id)
        return reservations_sweep(now=overdue)

    results = run_threads(30, work)

    swept = 0
    for index, hold in enumerate(holds):
        committed, released, sweep = results[3 * index : 3 * index + 3]
        assert isinstance(sweep, int), sweep
        swept += sweep
        reservation = Reservation.objects.get(pk=hold.id)
        cost = sum((line.cost for line in reservation.usage_records.all()), Decimal(0))
        if reservation.state == ReservationState.COMMITTED:
            assert isinstance(committed, CommitResult), committed
            assert released == ReservationState.COMMITTED
            assert cost == committed.cost == Decimal(15)
        else:
            assert reservation.state == ReservationState.RELEASED
            assert isinstance(committed, ReservationStateError), committed
            assert released == ReservationState.RELEASED
            assert cost == 0
    # Every hold the sweeps report expired went through EXPIRED exactly once.
    assert swept == UsageRecord.objects.filter(kind=UsageKind.CHARGE, is_estimated=True).count()
    counter = _counter()
    assert counter.reserved == 0
    _assert_ledger_consistent()


def test_concurrent_requests_with_one_idempotency_key_reserve_once() -> None:
    # D11 under concurrency: every caller gets the one reservation; it is held once.
    seed(limit="100")

    results = run_threads(10, lambda _: reserve_30(idempotency_key="req-1"))

    assert all(isinstance(r, budgets.Hold) for r in results), results
    assert len({r.id for r in results}) == 1  # type: ignore[union-attr]
    assert Reservation.objects.count() == 1
    assert _counter().reserved == Decimal(30)
    _assert_ledger_consistent()


def test_one_idempotency_key_near_the_limit_is_never_refused_for_its_own_hold() -> None:
    # Room for one hold: the callers that lose the race for the counter see the winner's hold
    # there, and must get that reservation back, not a refusal caused by it.
    seed(limit="50")

    results = run_threads(10, lambda _: reserve_30(idempotency_key="req-1"))

    assert all(isinstance(r, budgets.Hold) for r in results), results
    assert len({r.id for r in results}) == 1  # type: ignore[union-attr]
    assert Refusal.objects.count() == 0
    assert _counter().reserved == Decimal(30)
    _assert_ledger_consistent()


def test_admitted_calls_that_fail_leave_nothing_spent() -> None:
    # D3 with real threads: four admitted calls whose provider call fails are released.
    seed(limit="120")

    def call(_: int) -> None:
        with reserve_30():
            raise ProviderFailed

    results = run_threads(4, call)

    assert all(isinstance(r, ProviderFailed) for r in results), results
    assert set(Reservation.objects.values_list("state", flat=True)) == {ReservationState.RELEASED}
    counter = _counter()
    assert (counter.spent, counter.reserved) == (Decimal(0), Decimal(0))
    assert not UsageRecord.objects.exists()
    # The whole budget is available again.
    assert len(_admitted(run_threads(4, lambda _: reserve_30()))) == 4
    _assert_ledger_consistent()
