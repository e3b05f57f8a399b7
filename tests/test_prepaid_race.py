"""Prepaid balances under real concurrency (issue 30): no spend beyond the balance, each top-up
credited once whatever deliveries race, one auto-recharge per crossing under a burst of commits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.utils import timezone

from llm_budgets.billing.balances import recharge_rules_clear
from llm_budgets.billing.credits import (
    account_of,
    balance_state,
    credit_add,
    credits_expire,
    recharge_set,
)
from llm_budgets.billing.recharge import recharges_send
from llm_budgets.db.boundary import ledger_transaction
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import CreditLot, LotKind, TopUp, TopUpKind
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.concurrency import lock_waited, overspent_counters, patient_lock_waits, run_threads
from tests.factories import reserve_30
from tests.prepaid_support import deliver, pay, prepaid
from tests.stripe_support import fake_stripe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]
__all__ = ["fake_stripe"]


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    recharge_rules_clear()
    with patient_lock_waits():
        yield
    recharge_rules_clear()


def _reserve(_: int) -> str:
    try:
        reserve_30()
    except BudgetExceeded:
        return "refused"
    return "admitted"


@pytest.mark.parametrize("calls", [10, 40])
def test_threads_never_hold_more_than_the_balance(fake_stripe: StripeServer, calls: int) -> None:
    prepaid(fake_stripe)
    credit_add(account=account_of("acme"), amount="100", actor="t", reason="r")
    results = run_threads(calls, _reserve)
    assert results.count("admitted") == 3, results
    state = balance_state(account_of("acme"))
    assert (state.credit, state.held) == (Decimal(100), Decimal(90))
    assert overspent_counters() == []


def test_racing_deliveries_of_one_payment_credit_it_once(fake_stripe: StripeServer) -> None:
    customer = prepaid(fake_stripe)
    events = pay(fake_stripe, "75")[1]
    results = run_threads(8, lambda i: deliver(events[i % 2]))
    assert all(status in (200, 500) for status in results), results
    for event in events:  # Stripe redelivers whatever was answered 500
        assert deliver(event) == 200
    assert balance_state(account_of("acme")).credit == Decimal(75)
    assert CreditLot.objects.count() == 1
    assert len(fake_stripe.live_grants(customer)) == 1


def test_a_burst_of_commits_crossing_the_threshold_recharges_once(
    fake_stripe: StripeServer,
) -> None:
    customer = prepaid(fake_stripe)
    for event in pay(fake_stripe, "300")[1]:  # saves the card
        assert deliver(event) == 200
    recharge_set(tenant="acme", below="200", amount="100", daily_max="100", actor="t")
    holds = [reserve_30() for _ in range(8)]  # 240 held of 300
    results = run_threads(8, lambda i: holds[i].commit(input_tokens=0, output_tokens=1000))
    assert not [r for r in results if isinstance(r, BaseException)], results
    recharges = TopUp.objects.filter(kind=TopUpKind.RECHARGE)
    assert recharges.count() == 1
    assert run_threads(3, lambda i: recharges_send()).count(None) == 0
    state = balance_state(account_of("acme"))
    assert (state.credit, state.spent) == (Decimal(400), Decimal(240))
    assert recharges.get().state == "credited"
    intents = [i for i in fake_stripe.state.payment_intents.values() if i["status"] == "succeeded"]
    assert len(intents) == 2  # the checkout and one recharge
    assert len(fake_stripe.live_grants(customer)) == 2


def test_an_admission_waiting_on_a_lowering_sees_the_lowered_balance(
    fake_stripe: StripeServer, on_postgres: bool
) -> None:
    """The admission reads the balance (100) while an expiry holds its counter and has lowered it
    to 0 uncommitted; it takes the lock after the expiry commits, and must refuse."""
    if not on_postgres:
        pytest.skip("SQLite's write lock is taken at BEGIN: the read cannot precede the lowering")
    prepaid(fake_stripe)
    now = timezone.now()
    credit_add(
        account=account_of("acme"),
        amount="100",
        kind=LotKind.PROMOTIONAL,
        expires_at=now + timedelta(hours=1),
        actor="t",
        reason="trial",
    )
    lowered, proceed = threading.Event(), threading.Event()

    def expire() -> None:
        # The ledger's own transaction, held open: the expiry's lowering stays uncommitted.
        with ledger_transaction():
            credits_expire(now=now + timedelta(hours=2))
            lowered.set()
            assert proceed.wait(30)

    expiry = threading.Thread(target=lambda: (expire(), connections.close_all()))
    expiry.start()
    assert lowered.wait(30)
    outcome: list[str] = []
    admission = threading.Thread(
        target=lambda: (outcome.append(_reserve(0)), connections.close_all())
    )
    admission.start()
    assert lock_waited(), "the admission never waited on the counter's lock"
    proceed.set()
    expiry.join(30)
    admission.join(30)
    assert outcome == ["refused"]
    state = balance_state(account_of("acme"))
    assert (state.credit, state.held) == (0, 0)


def test_racing_refund_and_dispute_of_one_top_up_take_back_each_once_with_one_live_grant(
    fake_stripe: StripeServer,
) -> None:
    """Issue #38: a refund and a dispute of the same top-up, each delivered four times at once:
    each takes back its own amount once, and Stripe is left with one grant for what is live."""
    customer = prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "100")
    assert deliver(events[1]) == 200
    intent = events[1]["data"]["object"]["id"]
    both = [fake_stripe.refund(intent, 3000), fake_stripe.dispute(intent, 2000)]
    results = run_threads(8, lambda i: deliver(both[i % 2]))
    assert all(status in (200, 500) for status in results), results
    for event in both:  # Stripe redelivers whatever was answered 500
        assert deliver(event) == 200
    top_up.refresh_from_db()
    assert (top_up.refunded, top_up.disputed, top_up.unrecovered) == (30, 20, 0)
    assert balance_state(account_of("acme")).credit == Decimal(50)
    (grant,) = fake_stripe.live_grants(customer)
    assert grant["amount"]["monetary"]["value"] == 5000
    lot = CreditLot.objects.get()
    assert (lot.stripe_grant_id, lot.stripe_granted, lot.taken_back) == (grant["id"], 50, 50)
