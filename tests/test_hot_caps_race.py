"""Hot caps under real concurrency (issue #15 part 1): threads and forked processes released
together, each on its own connection, at caps a few calls from full, and limit changes racing
admissions. On PostgreSQL (SKIP LOCKED stripes, the exact path's locks) and on SQLite; marked
``concurrency``, so the PgBouncer leg (``make test-pgbouncer``) runs them too.

Every race must admit exactly ``floor(room / amount)``, refuse only with the whole cap's room
below the amount (never early), and leave no drift, no cap past its limit and no allowance
promising more than its cap has left."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.reconcile import allowances_excess, counters_drift
from llm_budgets.models import Budget, Counter, Scope
from tests.concurrency import (
    RowLocker,
    lock_waited,
    overspent_counters,
    patient_lock_waits,
    refused_early,
    run_processes,
    run_threads,
    worst_case,
)
from tests.factories import price_fake, reserve_30

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]

# Each call's worst case: 100 output tokens of fake/m30 at 0.03, and the input tolerance at its
# free input: exactly 3.
TOKENS = 100
AMOUNT = worst_case(
    input_tokens=0,
    max_output_tokens=TOKENS,
    input_per_mtok=Decimal(0),
    output_per_mtok=Decimal(30000),
)


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    with patient_lock_waits():
        yield


def _caps(*, stripes: int = 8, global_limit: str = "100000") -> None:
    """A hot global cap, and acme's hot tenant cap of 100 with a hot each-end-user cap of 60."""
    price_fake()
    budgets.set_limit(amount=Decimal(global_limit), window="month", hot=True, stripes=stripes)
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month", hot=True, stripes=stripes)
    budgets.set_limit(
        tenant="acme", end_user="*", amount=Decimal(60), window="month", hot=True, stripes=4
    )


def _reserve(index: int) -> budgets.Hold:
    return reserve_30(end_user=f"u{index % 3}", max_output_tokens=TOKENS)


def _fill(holds: int) -> None:
    """Take ``holds`` holds of 3 one at a time (spread over u0..u2), so the stripes exist."""
    for i in range(holds):
        _reserve(i)


def _used(scope: str) -> Decimal:
    rows = Counter.objects.filter(budget__scope=scope)
    return sum((c.spent + c.reserved for c in rows), Decimal(0))


def _refusals_justified(results: list[object]) -> list[budgets.Hold]:
    """The holds among ``results``; every other result is a refusal with the whole cap's room
    below the amount (never early)."""
    unexpected = [r for r in results if not isinstance(r, budgets.Hold | BudgetExceeded)]
    assert not unexpected, unexpected
    early = [r for r in results if isinstance(r, BudgetExceeded) and refused_early(r, AMOUNT)]
    assert not early, early
    return [r for r in results if isinstance(r, budgets.Hold)]


def _consistent() -> None:
    assert counters_drift() == []
    assert overspent_counters() == []
    assert allowances_excess() == []


@pytest.mark.parametrize("stripes", [2, 8])
def test_threads_at_a_nearly_full_hot_cap_take_exactly_the_room(stripes: int) -> None:
    _caps(stripes=stripes)
    _fill(26)  # 78 of acme's 100: room 22, seven calls of 3 (one left over)

    results = run_threads(24, _reserve)

    admitted = _refusals_justified(results)
    assert len(admitted) == 7, results
    assert _used(Scope.TENANT) == Decimal(99)
    assert {r.remaining for r in results if isinstance(r, BudgetExceeded)} == {Decimal(1)}
    assert Counter.objects.filter(budget__scope=Scope.TENANT).count() == stripes
    _consistent()


def test_threads_at_a_nearly_full_hot_global_cap_take_exactly_the_room() -> None:
    # The global cap is the one a few calls from full; every other cap has room.
    _caps(global_limit="45")
    _fill(12)  # 36 of 45: three calls of 3 left

    results = run_threads(20, _reserve)

    assert len(_refusals_justified(results)) == 3, results
    assert _used(Scope.GLOBAL) == Decimal(45)
    _consistent()


def test_threads_on_a_hot_cap_with_room_all_take_stripes() -> None:
    # Far from the limit: 30 calls all admitted, spread over the stripes.
    _caps()
    _fill(1)

    results = run_threads(30, _reserve)

    assert len(_refusals_justified(results)) == 30, results
    assert _used(Scope.GLOBAL) == Decimal(93)
    _consistent()


def _outcome(index: int) -> str:
    try:
        _reserve(index)
    except BudgetExceeded as exc:
        return "early" if refused_early(exc, AMOUNT) else "refused"
    return "admitted"


def test_processes_at_a_nearly_full_hot_cap_take_exactly_the_room() -> None:
    _caps()
    _fill(28)  # 84 of 100: room 16, five calls of 3

    results = run_processes(16, _outcome)

    values = [value for status, value in results if status == "ok"]
    assert (values.count("admitted"), values.count("refused"), len(values)) == (5, 11, 16), results
    assert _used(Scope.TENANT) == Decimal(99)
    _consistent()


def test_a_lower_limit_racing_admissions_never_refuses_early_nor_overspends() -> None:
    # 20 calls of 3 against 60 while the cap drops to 30: each call sees 60 or 30; however
    # they interleave, at least 10 get in (30 is room for 10), none past 60, and afterwards
    # the cap is exactly 30 for everyone.
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(60), window="month", hot=True, stripes=4)
    _reserve(0).release()  # the stripes exist and are split for 60

    def work(index: int) -> object:
        if index == 20:
            return budgets.set_limit(tenant="acme", amount=Decimal(30), window="month")
        try:
            return _reserve(index)
        except BudgetExceeded as exc:
            return exc

    results = run_threads(21, work)

    refusals = [r for r in results[:20] if isinstance(r, BudgetExceeded)]
    admitted = _refusals_justified(results[:20])
    assert {r.limit for r in refusals} <= {Decimal(60), Decimal(30)}
    used = _used(Scope.TENANT)
    assert len(admitted) >= 10, results
    assert used == AMOUNT * len(admitted) <= Decimal(60)
    with pytest.raises(BudgetExceeded) as after:
        _reserve(0)
    assert (after.value.limit, after.value.remaining) == (30, max(Decimal(0), 30 - used))
    assert counters_drift() == []
    assert allowances_excess() == []


def test_a_raise_racing_admissions_is_used_and_never_refused_early() -> None:
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    budget = budgets.set_limit(
        tenant="acme", amount=Decimal(30), window="month", hot=True, stripes=4
    )
    _reserve(0).release()
    raised = Budget.objects.get(pk=budget.id)
    until = timezone.now() + timedelta(hours=1)

    def work(index: int) -> object:
        if index == 20:
            return budget_raise_grant(budget=raised, amount=30, until=until, reason="race")
        try:
            return _reserve(index)
        except BudgetExceeded as exc:
            return exc

    results = run_threads(21, work)

    admitted = _refusals_justified(results[:20])
    assert 10 <= len(admitted) <= 20
    # After the raise, the cap is 60 for everyone: the rest of the room is admitted.
    for index in range(20 - len(admitted)):
        _reserve(index)
    with pytest.raises(BudgetExceeded) as full:
        _reserve(0)
    assert (full.value.limit, full.value.remaining) == (60, 0)
    assert _used(Scope.TENANT) == Decimal(60)
    assert counters_drift() == []
    assert allowances_excess() == []
    assert Budget.objects.get(pk=budget.id).hot


def test_a_call_finding_every_stripe_busy_waits_for_one_instead_of_splitting_again(
    on_postgres: bool,
) -> None:
    """Every stripe of acme's cap is held by another transaction, all with room: the call waits
    for one of them (the waiting path), takes its hold there and leaves the split alone. The
    exact path would have waited for both and split the room again (allowances changed)."""
    if not on_postgres:
        pytest.skip("SQLite has no row locks: a stripe is never busy")
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month", hot=True, stripes=2)
    _reserve(0).release()  # the stripes exist, split for 100
    stripes = Counter.objects.filter(budget__scope=Scope.TENANT)
    # Split unevenly (40 and 60: the invariant holds), so splitting again would change them.
    for stripe in stripes:
        stripes.filter(pk=stripe.pk).update(allowance=Decimal(40 if stripe.stripe == 0 else 60))
    before = {c.pk: (c.allowance, c.reserved) for c in stripes.all()}
    assert len(before) == 2
    admitted: list[budgets.Hold] = []

    def admit() -> None:
        try:
            admitted.append(_reserve(1))
        finally:
            connections.close_all()

    call = threading.Thread(target=admit)
    with RowLocker(list(before)):  # every stripe, by another transaction
        call.start()
        assert lock_waited(), "the call never waited for a stripe"
    call.join(30)

    assert len(admitted) == 1
    after = {c.pk: (c.allowance, c.reserved) for c in stripes.all()}
    assert {pk: allowance for pk, (allowance, _) in after.items()} == {
        pk: allowance for pk, (allowance, _) in before.items()
    }
    assert sorted(reserved - before[pk][1] for pk, (_, reserved) in after.items()) == [0, AMOUNT]
    _consistent()
