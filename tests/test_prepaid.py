"""Prepaid balances (issue 30): admission against a balance, refusal that says to top up, Stripe
top-ups credited once with their credit grant (through the fault proxy), refunds, expiry."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.alerts.endpoints import endpoint_create
from llm_budgets.billing.balances import recharge_rules_clear
from llm_budgets.billing.credits import (
    account_of,
    attribution,
    balance_adjust,
    balance_open,
    balance_state,
    credit_add,
    credits_expire,
    lots_last_used_first,
    order_of_use,
    recharge_set,
)
from llm_budgets.billing.recharge import recharges_send
from llm_budgets.billing.topups import credit_grant, top_up_checkout
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    KillSwitchActive,
    PaymentProviderError,
)
from llm_budgets.models import (
    AlertEvent,
    AuditEvent,
    Counter,
    CreditLot,
    KillSwitch,
    LotKind,
    StripeWebhookEvent,
    TopUp,
)
from llm_budgets.testing.fakes.stripe_server import StripeServer
from llm_budgets.testing.faultproxy import FaultProxy
from tests.concurrency import outside_connection
from tests.factories import price_fake, reserve_30
from tests.prepaid_support import TOP_UP_URL, deliver, pay, prepaid
from tests.stripe_support import fake_stripe, set_up, stripe_settings

pytestmark = pytest.mark.django_db
__all__ = ["fake_stripe"]


@pytest.fixture(autouse=True)
def rules_forgotten() -> Iterator[None]:
    recharge_rules_clear()  # the per-process cache of tenants with a rule
    yield
    recharge_rules_clear()


def available() -> Decimal:
    return balance_state(account_of("acme")).available


def test_a_balance_at_zero_refuses_saying_top_up_with_the_hosts_url(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30()
    assert "Top up the balance at " + TOP_UP_URL in str(refused.value)
    assert refused.value.resets_at is None
    assert refused.value.remaining == 0


def test_spend_draws_the_balance_down_at_customer_price_to_a_refusal(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    credit_add(account=account_of("acme"), amount="65", actor="test", reason="trial")
    first = reserve_30()
    assert available() == Decimal(35)  # the worst case is held against the balance
    first.commit(input_tokens=0, output_tokens=500)  # costs 15
    assert balance_state(account_of("acme")).spent == Decimal(15)
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # 30
    assert available() == Decimal(20)
    with pytest.raises(BudgetExceeded, match=r"prepaid balance has 20\.00 USD left"):
        reserve_30()


def test_a_checkout_top_up_is_credited_once_with_one_credit_grant(
    fake_stripe: StripeServer,
) -> None:
    customer = prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "100")
    session = fake_stripe.state.checkout_sessions[top_up.checkout_session_id or ""]
    assert session["amount_total"] == 10000
    assert session["customer"] == customer
    for event in [*events, *events, events[1], events[0]]:  # both events, each redelivered
        assert deliver(event) == 200
    assert available() == Decimal(100)
    assert CreditLot.objects.get().top_up_id == top_up.pk
    grants = fake_stripe.live_grants(customer)
    assert len(grants) == 1
    assert grants[0]["amount"]["monetary"] == {"currency": "usd", "value": 10000}
    assert grants[0]["category"] == "paid"
    assert grants[0]["applicability_config"] == {"scope": {"price_type": "metered"}}
    top_up.refresh_from_db()
    assert top_up.state == "credited"
    assert top_up.payment_intent_id == events[1]["data"]["object"]["id"]
    assert account_of("acme").payment_method_id == "pm_card_visa"


def test_an_unpaid_checkout_completion_credits_nothing_until_the_payment_succeeds(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    _, events = pay(fake_stripe, "10")
    events[0]["data"]["object"]["payment_status"] = "unpaid"  # a delayed payment method
    assert deliver(events[0]) == 200
    assert available() == 0
    assert deliver(events[1]) == 200
    assert available() == Decimal(10)


def test_a_package_top_up_and_unknown_packages(fake_stripe: StripeServer, settings: Any) -> None:
    prepaid(fake_stripe)
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "PREPAID_PACKAGES": {"starter": "25"}}
    started = top_up_checkout(
        tenant="acme", package="starter", success_url="https://h/ok", cancel_url="https://h/no"
    )
    assert started.top_up.amount == Decimal(25)
    with pytest.raises(InvalidUsage, match="Unknown package 'gold'; the packages are: starter"):
        top_up_checkout(
            tenant="acme", package="gold", success_url="https://h/ok", cancel_url="https://h/no"
        )
    with pytest.raises(InvalidUsage, match="more than 2 decimal places"):
        top_up_checkout(
            tenant="acme", amount="1.005", success_url="https://h/ok", cancel_url="https://h/no"
        )


def test_a_paid_amount_that_differs_from_the_top_up_is_not_credited(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    _, events = pay(fake_stripe, "10")
    events[1]["data"]["object"]["amount_received"] = 999
    assert deliver(events[1]) == 500
    assert available() == 0
    assert "but 9.99 was paid" in StripeWebhookEvent.objects.get().error


@pytest.mark.parametrize("fault", ["500", "drop_before", "drop_after"])
def test_a_failed_credit_grant_rolls_the_credit_back_and_the_redelivery_credits_once(
    fake_stripe: StripeServer, fault: str
) -> None:
    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "40")
    fake_stripe.inject("/v1/billing/credit_grants", fault)
    assert deliver(events[1]) == 500
    assert available() == 0
    assert deliver(events[1]) == 200  # Stripe redelivers
    assert deliver(events[0]) == 200
    assert available() == Decimal(40)
    assert len(fake_stripe.live_grants(customer)) == 1


def test_an_answer_lost_in_the_network_after_stripe_made_the_grant_is_not_a_second_grant(
    settings: Any,
) -> None:
    """Through the fault proxy: the grant request reaches Stripe, its answer is cut off."""
    with (
        StripeServer() as fake,
        FaultProxy("127.0.0.1", int(fake.base_url.rsplit(":", 1)[1])) as proxy,
    ):
        settings.LLM_BUDGETS = stripe_settings(f"http://127.0.0.1:{proxy.port}")
        customer = prepaid(fake)
        _, events = pay(fake, "40")
        proxy.cut_when_client_sends(b"metered", before=False)  # in the body
        assert deliver(events[1]) == 500
        assert len(fake.live_grants(customer)) == 1  # Stripe made it; we never heard
        assert available() == 0
        assert deliver(events[1]) == 200
        assert available() == Decimal(40)
        assert len(fake.live_grants(customer)) == 1
        assert proxy.counts


def test_a_refund_before_spending_takes_the_credit_back_and_after_spending_leaves_a_debt(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "100")
    deliver(events[1])
    intent = events[1]["data"]["object"]["id"]
    assert deliver(fake_stripe.refund(intent, 2000)) == 200  # 20 back
    assert available() == Decimal(80)
    for _ in range(2):
        reserve_30().commit(input_tokens=0, output_tokens=1000)  # 60 spent
    refund = fake_stripe.refund(intent, 8000)  # the rest: 80, of which 60 was spent
    assert deliver(refund) == 200
    assert deliver(refund) == 200
    state = balance_state(account_of("acme"))
    assert (state.credit, state.spent, state.available) == (0, 60, 0)
    assert state.debt == 60
    top_up.refresh_from_db()
    assert (top_up.refunded, top_up.unrecovered) == (Decimal(100), 0)
    assert AuditEvent.objects.filter(action="credits.take_back").count() == 2
    # The next top-up pays the debt first, and says so.
    _, events = pay(fake_stripe, "100")
    assert deliver(events[1]) == 200
    assert "60.00 of it paid the balance's debt first" in (
        StripeWebhookEvent.objects.get(id=events[1]["id"]).outcome
    )
    state = balance_state(account_of("acme"))
    assert (state.available, state.debt) == (40, 0)


def test_a_dispute_takes_its_amount_back_even_when_held_and_the_commit_is_debt(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    _, events = pay(fake_stripe, "50")
    deliver(events[0])
    hold = reserve_30()
    assert deliver(fake_stripe.dispute(events[1]["data"]["object"]["id"], 5000)) == 200
    state = balance_state(account_of("acme"))
    assert (state.credit, state.held, state.available) == (0, 30, 0)
    assert state.debt == 0
    with pytest.raises(BudgetExceeded):
        reserve_30()
    hold.commit(input_tokens=0, output_tokens=1000)
    state = balance_state(account_of("acme"))
    assert (state.spent, state.available, state.debt) == (30, 0, 30)


def test_a_dispute_after_a_partial_refund_takes_back_its_own_amount(
    fake_stripe: StripeServer,
) -> None:
    """Issue #38: top up 50, refund 30, dispute 20: the dispute took nothing back (its 20 was
    compared with the 30 refunded), and the customer kept 20 of credit it had recovered."""
    prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "50")
    deliver(events[1])
    intent = events[1]["data"]["object"]["id"]
    refund = fake_stripe.refund(intent, 3000)
    dispute = fake_stripe.dispute(intent, 2000)
    for event in (refund, dispute, refund, dispute):  # each redelivered: counted once
        assert deliver(event) == 200
    assert (balance_state(account_of("acme")).credit, available()) == (0, 0)
    with pytest.raises(BudgetExceeded):
        reserve_30(max_output_tokens=100)
    top_up.refresh_from_db()
    assert (top_up.refunded, top_up.disputed, top_up.dispute_status) == (30, 20, "open")
    assert top_up.unrecovered == 0


def test_a_refund_event_older_than_the_last_changes_nothing(fake_stripe: StripeServer) -> None:
    prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "50")
    deliver(events[1])
    intent = events[1]["data"]["object"]["id"]
    first, second = fake_stripe.refund(intent, 1000), fake_stripe.refund(intent, 1000)
    assert deliver(second) == 200  # Stripe does not order deliveries
    assert deliver(first) == 200
    top_up.refresh_from_db()
    assert (top_up.refunded, available()) == (20, 30)


@pytest.mark.parametrize(("status", "credit"), [("won", 50), ("warning_closed", 50), ("lost", 0)])
def test_a_won_dispute_gives_its_amount_back_and_a_lost_one_keeps_it(
    fake_stripe: StripeServer, status: str, credit: int
) -> None:
    prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "50")
    deliver(events[1])
    dispute = fake_stripe.dispute(events[1]["data"]["object"]["id"], 5000)
    assert deliver(dispute) == 200
    assert available() == 0
    closed = fake_stripe.dispute_close(dispute, status)
    assert deliver(closed) == 200
    assert deliver(dispute) == 200  # a late redelivery of the opening changes nothing
    top_up.refresh_from_db()
    assert top_up.dispute_status == ("lost" if status == "lost" else "won")
    assert (balance_state(account_of("acme")).credit, available()) == (credit, credit)


def test_a_won_dispute_recovers_what_was_unrecovered_first(fake_stripe: StripeServer) -> None:
    prepaid(fake_stripe)
    top_up, events = pay(fake_stripe, "50")
    deliver(events[1])
    balance_adjust(tenant="acme", amount="20", direction="remove", actor="s", reason="goodwill")
    dispute = fake_stripe.dispute(events[1]["data"]["object"]["id"], 5000)
    deliver(dispute)  # 30 left in the lot to take; 20 gone already
    top_up.refresh_from_db()
    assert (top_up.unrecovered, balance_state(account_of("acme")).credit) == (20, 0)
    deliver(fake_stripe.dispute_close(dispute, "won"))
    top_up.refresh_from_db()
    assert (top_up.unrecovered, balance_state(account_of("acme")).credit) == (0, 30)


def test_promotional_credit_is_used_first_and_expires_unused_part_only(
    fake_stripe: StripeServer,
) -> None:
    customer = prepaid(fake_stripe)
    now = timezone.now()
    account = account_of("acme")
    credit_add(account=account, amount="100", kind=LotKind.PAID, actor="t", reason="paid")
    credit_grant(
        tenant="acme", amount="50", expires_at=now + timedelta(days=30), actor="t", reason="trial"
    )
    grant = fake_stripe.live_grants(customer)[0]
    assert (grant["category"], grant["priority"]) == ("promotional", 10)
    assert grant["expires_at"] == int((now + timedelta(days=30)).timestamp())
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # 30: from the promotional lot
    assert credits_expire(now=now + timedelta(days=29)) == 0
    assert credits_expire(now=now + timedelta(days=31)) == 1
    state = balance_state(account_of("acme"))
    # 20 promotional unused is forfeited; the paid 100 is untouched.
    assert (state.credit, state.spent, state.available) == (Decimal(130), Decimal(30), Decimal(100))
    assert credits_expire(now=now + timedelta(days=32)) == 0


def test_a_lot_expiring_while_held_forfeits_it_all_and_the_release_does_not_restore_it(
    fake_stripe: StripeServer,
) -> None:
    """Issue #38: a lot expiring while all of it was held forfeited nothing; released, the
    expired credit was spendable again, and expiry never ran for it again."""
    prepaid(fake_stripe)
    now = timezone.now()
    account = account_of("acme")
    credit_add(
        account=account,
        amount="30",
        kind=LotKind.PROMOTIONAL,
        expires_at=now + timedelta(hours=1),
        actor="t",
        reason="r",
    )
    credit_add(account=account, amount="10", kind=LotKind.PAID, actor="t", reason="r")
    hold = reserve_30()  # all of the promotional 30 held
    assert credits_expire(now=now + timedelta(hours=2)) == 1
    state = balance_state(account_of("acme"))
    assert (state.credit, state.held, state.available) == (10, 30, 0)
    with pytest.raises(BudgetExceeded):  # the limit is below spent + held: nothing admitted
        reserve_30(max_output_tokens=100)
    hold.release()
    assert available() == 10  # the paid lot only
    assert credits_expire(now=now + timedelta(hours=3)) == 0
    assert available() == 10


def test_a_hold_on_expired_credit_that_commits_is_debt(fake_stripe: StripeServer) -> None:
    prepaid(fake_stripe)
    now = timezone.now()
    credit_add(
        account=account_of("acme"),
        amount="45",
        kind=LotKind.PROMOTIONAL,
        expires_at=now + timedelta(hours=1),
        actor="t",
        reason="r",
    )
    reserve_30().commit(input_tokens=0, output_tokens=500)  # 15 spent
    hold = reserve_30()
    credits_expire(now=now + timedelta(hours=2))
    assert balance_state(account_of("acme")).credit == 15  # the spent part stays
    hold.commit(input_tokens=0, output_tokens=1000)
    state = balance_state(account_of("acme"))
    assert (state.spent, state.available, state.debt) == (45, 0, 30)


def test_staff_adjustments_need_a_reason_and_never_go_below_spent(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    with pytest.raises(InvalidUsage, match="needs a reason"):
        balance_adjust(tenant="acme", amount="5", direction="add", actor="s", reason=" ")
    balance_adjust(tenant="acme", amount="50", direction="add", actor="s", reason="goodwill")
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    with pytest.raises(InvalidUsage, match=r"only 20\.00 is neither spent nor held"):
        balance_adjust(tenant="acme", amount="21", direction="remove", actor="s", reason="oops")
    assert balance_adjust(
        tenant="acme", amount="20", direction="remove", actor="s", reason="ok"
    ) == Decimal(30)
    assert AuditEvent.objects.filter(action__in=["credits.add", "credits.remove"]).count() == 2


def _balance_with_lots(
    lots: int, rng: random.Random, *, amounts: tuple[int, int], expiring_in: tuple[int, ...]
) -> datetime:
    """Acme's balance with ``lots`` lots of random amounts (between ``amounts``), kinds and
    expiries (none, or in one of ``expiring_in`` days), created within a few seconds of each
    other (ties included); returns when it started."""
    price_fake()
    budgets.ensure_tenant(tenant="acme", name="Acme")
    balance_open(tenant="acme", actor="s")
    account = account_of("acme")
    now = timezone.now()
    for _ in range(lots):
        credit_add(
            account=account,
            amount=str(rng.randint(*amounts)),
            kind=rng.choice([LotKind.PAID, LotKind.PROMOTIONAL]),
            expires_at=rng.choice([None, *(now + timedelta(days=d) for d in expiring_in)]),
            actor="s",
            now=now + timedelta(seconds=rng.randint(0, 3)),
        )
    return now


def _lots_with_history(lots: int) -> list[CreditLot]:
    """A balance with ``lots`` lots of every kind, some expiring, some expired with part of them
    spent (so still live), created in a shuffled order with ties; returns them oldest first."""
    now = _balance_with_lots(lots, random.Random(38), amounts=(5, 40), expiring_in=(1, 30))
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # spent 30, on the first lots used
    credits_expire(now=now + timedelta(days=2))
    return list(CreditLot.objects.order_by("created_at", "pk"))


def test_a_removal_forfeits_from_the_last_used_lots_first() -> None:
    """``balance_adjust`` reads the lots a few at a time, newest use first; it forfeits exactly
    what the rule says when applied to every lot (the order of use, reversed)."""
    _lots_with_history(40)
    for amount in ("3", "7", "1", "40", "0.5", "90"):
        lots = list(CreditLot.objects.all())
        expected = {lot.pk: lot.forfeited for lot in lots}
        left = Decimal(amount)
        for lot in sorted(lots, key=order_of_use, reverse=True):
            take = min(left, lot.amount - lot.forfeited)
            expected[lot.pk] += take
            left -= take
        balance_adjust(tenant="acme", amount=amount, direction="remove", actor="s", reason="t")
        assert dict(CreditLot.objects.values_list("pk", "forfeited")) == expected, amount


def test_postgresql_reads_a_removals_lots_through_their_index(on_postgres: bool) -> None:
    """The removal's order is the index's (``llmb_lot_last_used_first``): with sequential
    scans and sorts priced out, the plan is an index scan with no sort, so a removal reads the
    lots it returns, not every lot the account has had."""
    if not on_postgres:
        pytest.skip("the index serves the order on PostgreSQL (SQLite sorts)")
    _lots_with_history(20)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        plan = lots_last_used_first(account_of("acme")).select_for_update()[:16].explain()
    assert "llmb_lot_last_used_first" in plan, plan
    assert "Sort" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_a_removal_does_not_touch_the_lots_it_leaves_alone(on_postgres: bool) -> None:
    """A balance with years of top-ups: a removal locks only the lots it forfeits from, so a lot
    locked elsewhere (a refund of an old top-up) does not hold it up. Before, every lot was read
    and locked: slower with every top-up, and waiting here until the lock timeout."""
    if not on_postgres:
        pytest.skip("row locks: PostgreSQL")
    oldest = _lots_with_history(60)[0]
    forfeited = dict(CreditLot.objects.values_list("pk", "forfeited"))
    with outside_connection() as other:
        table = CreditLot._meta.db_table
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [oldest.pk])
        with override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 1}):
            balance_adjust(tenant="acme", amount="2", direction="remove", actor="s", reason="t")
        other.rollback()
    after = dict(CreditLot.objects.values_list("pk", "forfeited"))
    assert after[oldest.pk] == forfeited[oldest.pk]
    assert sum(after.values()) - sum(forfeited.values()) == 2


def test_lots_expiring_together_forfeit_what_expiring_them_one_at_a_time_would() -> None:
    """Expiry reads the order of use once per balance: many lots due in one run forfeit exactly
    what the rule leaves unspent when applied to each lot in turn, after the one before it
    expired (twice: the second run with expired lots of the first among those used)."""
    rng = random.Random(37)
    now = _balance_with_lots(30, rng, amounts=(2, 15), expiring_in=(1, 2, 3))
    account = account_of("acme")
    for days, spends in ((2, 4), (4, 3)):
        for _ in range(spends):
            reserve_30().commit(input_tokens=0, output_tokens=rng.randint(100, 1000))
        at = now + timedelta(days=days, hours=1)
        spent = Counter.objects.get(budget_id=account.budget_id).spent
        lots = list(CreditLot.objects.all())
        due = [
            lot
            for lot in lots
            if lot.expired_at is None and lot.expires_at is not None and lot.expires_at <= at
        ]
        for lot in sorted(due, key=lambda x: (x.expires_at, x.pk)):
            lot.forfeited = lot.amount - attribution(lots, spent)[lot.pk]
            lot.expired_at = at
        expected = {lot.pk: lot.forfeited for lot in lots}
        assert len(due) > 3, days
        assert credits_expire(now=at) == len(due)
        assert dict(CreditLot.objects.values_list("pk", "forfeited")) == expected, days


def test_checkout_needs_a_linked_customer_and_says_when_stripe_fails(
    fake_stripe: StripeServer,
) -> None:
    prepaid(fake_stripe)
    fake_stripe.inject("/v1/checkout/sessions", "500")
    with pytest.raises(PaymentProviderError, match="Nothing was charged"):
        top_up_checkout(
            tenant="acme", amount="5", success_url="https://h/ok", cancel_url="https://h/no"
        )
    assert TopUp.objects.get().state == "failed"
    budgets.ensure_tenant(tenant="other", name="Other")
    balance_open(tenant="other")
    with pytest.raises(InvalidUsage, match="not linked to a Stripe customer"):
        top_up_checkout(
            tenant="other", amount="5", success_url="https://h/ok", cancel_url="https://h/no"
        )


def test_a_lifetime_budget_that_is_not_a_balance_is_not_taken_over(
    fake_stripe: StripeServer,
) -> None:
    set_up(fake_stripe)
    budgets.set_limit(tenant="acme", amount=Decimal(5), window="lifetime")
    with pytest.raises(InvalidUsage, match="already has a lifetime budget"):
        balance_open(tenant="acme")


def test_a_balance_is_not_changed_by_setting_a_limit(fake_stripe: StripeServer) -> None:
    prepaid(fake_stripe)
    with pytest.raises(InvalidUsage, match="prepaid balance: change it with a top-up"):
        budgets.set_limit(tenant="acme", amount=Decimal(500), window="lifetime")


def saved_card_and_rule(fake: StripeServer, **rule: str) -> None:
    prepaid(fake)
    endpoint_create(
        tenant=None,
        kind="webhook",
        target="https://ops.example/alerts",
        event_types=["payment.failed"],
    )
    _, events = pay(fake, "100")
    assert deliver(events[1]) == 200
    recharge_set(tenant="acme", actor="t", **{"below": "80", "amount": "50", **rule})


def test_a_commit_crossing_the_threshold_queues_one_recharge_paid_off_session(
    fake_stripe: StripeServer,
) -> None:
    saved_card_and_rule(fake_stripe)
    reserve_30().commit(input_tokens=0, output_tokens=500)  # 85 left: above 80
    assert not TopUp.objects.filter(kind="recharge").exists()
    reserve_30().commit(input_tokens=0, output_tokens=500)  # 70 left: crossed
    reserve_30().commit(input_tokens=0, output_tokens=500)  # still below: same crossing
    assert TopUp.objects.filter(kind="recharge").count() == 1
    assert recharges_send() == {"credited": 1, "failed": 0, "skipped": 0, "retry": 0}
    assert available() == Decimal(105)
    intent = next(i for i in fake_stripe.state.payment_intents.values() if i["amount"] == 5000)
    assert intent["payment_method"] == "pm_card_visa"
    assert intent["status"] == "succeeded"
    # The webhook for the recharge's own payment finds it credited.
    assert deliver(fake_stripe._event("payment_intent.succeeded", intent)) == 200
    assert available() == Decimal(105)
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # 75: armed again, crossed again
    assert TopUp.objects.filter(kind="recharge").count() == 2


def test_a_declined_recharge_alerts_trips_the_payment_switch_and_a_top_up_clears_it(
    fake_stripe: StripeServer, settings: Any
) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "STRIPE_ON_PAYMENT_FAILED": "trip"}
    saved_card_and_rule(fake_stripe)
    fake_stripe.decline(fake_stripe.live_grants()[0]["customer"])
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    assert recharges_send()["failed"] == 1
    assert "declined" in TopUp.objects.get(kind="recharge").error
    event = AlertEvent.objects.get(type="payment.failed")
    assert event.body["action"] == "recharge_failed"
    switch = KillSwitch.objects.get(cleared_at__isnull=True)
    with pytest.raises(KillSwitchActive):
        reserve_30()
    fake_stripe.state.declining.clear()
    _, events = pay(fake_stripe, "20")
    assert deliver(events[0]) == 200
    switch.refresh_from_db()
    assert switch.cleared_at is not None
    reserve_30()


def test_recharges_beyond_the_daily_maximum_are_skipped_with_an_alert(
    fake_stripe: StripeServer,
) -> None:
    saved_card_and_rule(fake_stripe, daily_max="50")
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # 70: recharge 1
    recharges_send()
    for _ in range(3):  # 120 -> 30: recharge 2, beyond today's 50
        reserve_30().commit(input_tokens=0, output_tokens=1000)
    assert recharges_send()["skipped"] == 1
    assert TopUp.objects.get(kind="recharge", state="skipped").error.startswith(
        "daily maximum 50.00 USD reached"
    )
    assert AlertEvent.objects.filter(body__action="recharge_skipped").count() == 1


def test_reconciliation_is_clean_after_top_ups_and_grants_and_names_each_difference(
    fake_stripe: StripeServer,
) -> None:
    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "100")
    deliver(events[0])
    credit_grant(tenant="acme", amount="5", actor="t", reason="goodwill")
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    fake_stripe.apply_credit(customer, 3000)  # the invoice drew 30 from the grants
    out = StringIO()
    call_command("llm_budgets_credits_reconcile", stdout=out)
    assert "acme: credit 105.00, available 75.00, Stripe available 75.00: clean" in out.getvalue()
    # A grant voided in Stripe, and one made there by hand with our metadata.
    voided = fake_stripe.live_grants(customer)[1]["id"]
    fake_stripe.state.credit_grants[voided]["voided_at"] = 1
    fake_stripe.state.credit_grants["credgr_x"] = {
        **fake_stripe.live_grants(customer)[0],
        "id": "credgr_x",
    }
    with pytest.raises(CommandError, match=r"3 difference\(s\) in 1 balance"):
        call_command("llm_budgets_credits_reconcile", stdout=out)
    assert "has no live Stripe credit grant" in out.getvalue()
    assert "Stripe grant credgr_x (100.00 USD) is unknown to the ledger" in out.getvalue()
    assert (
        "Stripe's available credit 175.00 USD is more than the 105.00 the ledger keeps live"
        in out.getvalue()
    )


def reconciled() -> str:
    out = StringIO()
    with contextlib.suppress(CommandError):  # exit 1 on a difference: the text says which
        call_command("llm_budgets_credits_reconcile", stdout=out)
    return out.getvalue()


def test_a_take_back_replaces_the_grant_with_what_stripe_has_not_applied_of_the_live_part(
    fake_stripe: StripeServer,
) -> None:
    """Issue #38: the grant stayed as it was after a refund, and the reconciliation compared it
    with the lot's original amount: clean, while Stripe kept applying credit taken back."""
    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "100")
    deliver(events[1])
    (first,) = fake_stripe.live_grants(customer)
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    reserve_30().commit(input_tokens=0, output_tokens=1000)  # 60 spent
    assert fake_stripe.apply_credit(customer, 4000) == 4000  # 40 of it invoiced so far
    refund = fake_stripe.refund(events[1]["data"]["object"]["id"], 2000)
    assert deliver(refund) == 200
    assert deliver(refund) == 200
    (second,) = fake_stripe.live_grants(customer)
    assert fake_stripe.state.credit_grants[first["id"]]["voided_at"] is not None
    # 80 live; Stripe applied 40 of the voided grant: the replacement holds the other 40.
    assert second["amount"]["monetary"]["value"] == 4000
    assert (second["category"], second["priority"]) == ("paid", 50)
    lot = CreditLot.objects.get()
    assert (lot.stripe_grant_id, lot.stripe_applied, lot.stripe_granted) == (second["id"], 40, 40)
    assert "acme: credit 80.00, available 20.00, Stripe available 40.00: clean" in reconciled()
    # The next invoice draws the 20 spent and not yet invoiced: what is left agrees.
    assert fake_stripe.apply_credit(customer, 2000) == 2000
    assert "available 20.00, Stripe available 20.00: clean" in reconciled()


def test_a_take_back_whose_grant_replacement_fails_is_taken_all_the_same_and_put_in_step_later(
    fake_stripe: StripeServer,
) -> None:
    from llm_budgets.billing.topups import grants_follow

    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "100")
    deliver(events[1])
    fake_stripe.inject("/v1/billing/credit_grants", "500")  # the replacement's create
    assert deliver(fake_stripe.refund(events[1]["data"]["object"]["id"], 3000)) == 200
    assert available() == 70  # the ledger does not wait for Stripe
    assert "grant not in step yet" in StripeWebhookEvent.objects.get(type="charge.refunded").outcome
    assert fake_stripe.live_grants(customer) == []  # voided before the replacement failed
    assert "has no live Stripe credit grant" in reconciled()
    assert grants_follow() == 1
    assert grants_follow() == 0  # in step: nothing more
    (grant,) = fake_stripe.live_grants(customer)
    assert grant["amount"]["monetary"]["value"] == 7000
    assert "acme: credit 70.00, available 70.00, Stripe available 70.00: clean" in reconciled()


def test_reconciliation_flags_a_grant_left_above_the_live_part(fake_stripe: StripeServer) -> None:
    """Stripe still grants 200 where the ledger keeps 50 live (a grant never replaced)."""
    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "200")
    deliver(events[1])
    lot = CreditLot.objects.get()
    CreditLot.objects.filter(pk=lot.pk).update(forfeited=150)
    out = reconciled()
    assert f"lot {lot.pk} has 50.00 USD live" in out
    assert "but Stripe 200.00" in out
    assert "Stripe's available credit 200.00 USD is more than the 50.00" in out
    assert len(fake_stripe.live_grants(customer)) == 1


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        ("charge.refunded", {"id": "ch_1", "payment_intent": "pi_other", "amount_refunded": 500}),
        ("charge.dispute.created", {"id": "dp_1", "payment_intent": "pi_other", "amount": 500}),
        (
            "charge.dispute.closed",
            {"id": "dp_1", "payment_intent": "pi_other", "amount": 500, "status": "won"},
        ),
    ],
)
def test_money_going_back_for_a_payment_that_is_not_a_top_up_is_ignored(
    fake_stripe: StripeServer, kind: str, obj: dict[str, Any]
) -> None:
    """Another product's payment: ignored, not a failed event."""
    prepaid(fake_stripe)
    assert deliver({"id": f"evt_{kind}", "type": kind, "data": {"object": obj}}) == 200
    assert "of no credited top-up: ignored" in StripeWebhookEvent.objects.get().outcome


def test_a_redelivered_take_back_records_the_grant_a_failed_replacement_left_out(
    fake_stripe: StripeServer,
) -> None:
    customer = prepaid(fake_stripe)
    _, events = pay(fake_stripe, "100")
    deliver(events[1])
    refund = fake_stripe.refund(events[1]["data"]["object"]["id"], 3000)
    fake_stripe.inject("/v1/billing/credit_grants", "500")
    assert deliver(refund) == 200  # taken back; the replacement failed
    StripeWebhookEvent.objects.all().delete()  # as if this delivery were new to the ledger
    assert deliver(refund) == 200  # nothing more to take: the grant is put in step
    (grant,) = fake_stripe.live_grants(customer)
    lot = CreditLot.objects.get()
    assert (lot.stripe_grant_id, lot.stripe_granted, available()) == (grant["id"], 70, 70)


def test_an_expired_lot_reconciles_once_stripe_has_expired_its_grant_too(
    fake_stripe: StripeServer,
) -> None:
    import time_machine

    customer = prepaid(fake_stripe)
    now = timezone.now()
    credit_grant(
        tenant="acme", amount="40", expires_at=now + timedelta(hours=1), actor="t", reason="trial"
    )
    reserve_30().commit(input_tokens=0, output_tokens=500)  # 15 spent
    fake_stripe.apply_credit(customer, 1500)  # and invoiced
    credits_expire(now=now + timedelta(hours=2))
    assert balance_state(account_of("acme")).credit == 15  # the unspent 25 forfeited
    assert "expired but its Stripe grant" in reconciled()  # Stripe's clock is not there yet
    with time_machine.travel(now + timedelta(hours=2)):
        assert "acme: credit 15.00, available 0.00, Stripe available 0.00: clean" in reconciled()


def test_the_daily_command_expires_lots_and_records_the_job_the_report_does_not(
    fake_stripe: StripeServer,
) -> None:
    """The daily job as a command (hosts on cron): it expires due lots, as the task does, and
    records the job for /health; the reconciliation report alone records nothing."""
    from llm_budgets.models import JobRun
    from llm_budgets.schedule import CREDITS_DAILY

    prepaid(fake_stripe)
    account = account_of("acme")
    credit_add(account=account, amount="100", kind=LotKind.PAID, actor="t", reason="paid")
    lot = credit_add(
        account=account,
        amount="50",
        kind=LotKind.PROMOTIONAL,
        expires_at=timezone.now() + timedelta(days=1),
        actor="t",
        reason="trial",
    )
    assert balance_state(account_of("acme")).available == Decimal(150)
    reconciled()
    assert not JobRun.objects.filter(task=CREDITS_DAILY.task).exists()
    CreditLot.objects.filter(pk=lot.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with contextlib.suppress(CommandError):  # exit 1 on a difference: the report says which
        call_command("llm_budgets_credits_daily", stdout=StringIO())
    assert balance_state(account_of("acme")).available == Decimal(100)  # the 50 expired
    run = JobRun.objects.get(task=CREDITS_DAILY.task)
    assert run.finished_at is not None
    assert run.failed_at is None, run.error
