"""Prepaid balances under real concurrency (issue 30): no spend beyond the balance, each top-up
credited once whatever deliveries race, one auto-recharge per crossing under a burst of commits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from llm_budgets import budgets
from llm_budgets.billing.credits import (
    account_of,
    balance_open,
    balance_state,
    credit_add,
    recharge_set,
)
from llm_budgets.billing.recharge import recharges_send
from llm_budgets.billing.topups import top_up_checkout
from llm_budgets.engine.balances import recharge_rules_clear
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import CreditLot, TopUp, TopUpKind
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.concurrency import overspent_counters, patient_lock_waits, run_threads
from tests.factories import reserve_30
from tests.stripe_support import fake_stripe, set_up, sign

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]
__all__ = ["fake_stripe"]

URL = "/api/llm-budgets/v1/stripe/webhook"


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    recharge_rules_clear()
    with patient_lock_waits():
        yield
    recharge_rules_clear()


def deliver(event: dict[str, Any]) -> int:
    payload = json.dumps(event).encode()
    return (
        Client()
        .post(URL, payload, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(payload))
        .status_code
    )


def prepaid(fake: StripeServer) -> str:
    customer = set_up(fake)
    budgets.set_limit(tenant="acme", amount=Decimal("1000000"), window="month")
    balance_open(tenant="acme")
    return customer


def paid_checkout(fake: StripeServer, amount: str) -> list[dict[str, Any]]:
    started = top_up_checkout(
        tenant="acme", amount=amount, success_url="https://h/ok", cancel_url="https://h/no"
    )
    return fake.pay_checkout(started.session_id)


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
    events = paid_checkout(fake_stripe, "75")
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
    for event in paid_checkout(fake_stripe, "300"):  # saves the card
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
