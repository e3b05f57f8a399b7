"""Stripe metered billing (issue 11) with the real ``stripe`` package against a fake Stripe on
127.0.0.1: outbox beside the ledger, delivery per closed hour, remainders, late usage,
corrections, linking later, unlinking, faults, parking, reconciliation, setup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.billing.reconciliation import billing_reconcile
from llm_budgets.billing.stripe_push import delivery_retry, stripe_push
from llm_budgets.billing.totals import billed_in_period, billing_status
from llm_budgets.engine.adjustments import (
    budget_spend_reset,
    end_user_spend_reset,
    run_spend_reset,
    usage_void,
)
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    AuditEvent,
    BillingLine,
    Budget,
    DeliveryKind,
    EndUser,
    MeterDelivery,
    MeterDeliveryState,
    ReconciliationRun,
    Scope,
    StripeMeter,
    UsageRecord,
)
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.factories import reserve_30, seed
from tests.stripe_support import fake_stripe, ledger_units, odd_price, set_up

# Moves time with time_machine: admission follows this process's clock (conftest).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("application_clock")]
__all__ = ["fake_stripe"]

H = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def at(moment: datetime) -> time_machine.travel:
    return time_machine.travel(moment, tick=False)


def use(tokens: int = 1000, **kwargs: object) -> None:
    # A commit may report no more output than its hold's ceiling (issue 22 item 2).
    hold = reserve_30(max_output_tokens=max(tokens, 1000), **kwargs)
    hold.commit(input_tokens=0, output_tokens=tokens)


def sent_units(fake: StripeServer, customer: str) -> Decimal:
    return fake.total(customer)


def test_a_linked_tenants_usage_reaches_stripe_once_its_hour_has_closed(
    fake_stripe: StripeServer,
) -> None:
    with at(H + timedelta(minutes=5)):
        cid = set_up(fake_stripe)
        use(1000)
        use(500)
    assert BillingLine.objects.count() == 2  # one outbox row per ledger line
    with at(H + timedelta(minutes=50)):
        assert stripe_push().sent == 0  # the hour is still open
    with at(H + timedelta(hours=1, minutes=1)):
        result = stripe_push()
        assert (result.built, result.sent) == (1, 1)
        assert stripe_push().sent == 0  # nothing twice
    [event] = fake_stripe.live_events(cid)
    # 1500 tokens x 0.03 = 45 USD = 45,000,000 millionths, sent as a string
    assert event.value == Decimal(45_000_000) == ledger_units()
    assert event.timestamp == int((H + timedelta(minutes=5)).timestamp())
    delivery = MeterDelivery.objects.get()
    assert delivery.identifier == event.identifier
    assert delivery.state == MeterDeliveryState.SENT


def test_an_unlinked_tenant_gets_no_outbox_row() -> None:
    seed()
    use(1000)
    assert UsageRecord.objects.count() == 1
    assert BillingLine.objects.count() == 0


def test_the_outbox_row_is_written_in_the_ledger_lines_transaction(
    fake_stripe: StripeServer,
) -> None:
    set_up(fake_stripe)
    hold = reserve_30()

    class Boom(Exception):
        pass

    seen: list[tuple[int, int]] = []

    def commit_then_fail() -> None:
        with transaction.atomic():
            hold.commit(input_tokens=0, output_tokens=10)
            seen.append((BillingLine.objects.count(), UsageRecord.objects.count()))
            raise Boom

    with pytest.raises(Boom):
        commit_then_fail()
    assert seen == [(1, 1)]
    assert BillingLine.objects.count() == 0
    assert UsageRecord.objects.count() == 0


def test_remainders_are_carried_per_customer_never_rounded_away(
    fake_stripe: StripeServer,
) -> None:
    odd_price()
    with at(H):
        cid = set_up(fake_stripe)
    for hour in range(7):  # 333.3333 millionths an hour: each alone would round to 333
        with at(H + timedelta(hours=hour, minutes=1)):
            use(1000)
        with at(H + timedelta(hours=hour + 1, minutes=2)):
            stripe_push()
    exact = ledger_units()
    assert exact == Decimal("2333.3331")
    assert abs(sent_units(fake_stripe, cid) - exact) <= 1
    assert [e.value for e in fake_stripe.live_events(cid)] == [333, 334, 333, 333, 334, 333, 333]


def test_late_usage_for_a_sent_hour_goes_out_as_a_delta_never_the_total(
    fake_stripe: StripeServer,
) -> None:
    with at(H + timedelta(minutes=10)):
        cid = set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    # A line booked in that hour arrives late (e.g. a worker that was stuck).
    with at(H + timedelta(minutes=40)):
        use(100)
    with at(H + timedelta(hours=1, minutes=3)):
        stripe_push()
    values = sorted(e.value for e in fake_stripe.live_events(cid))
    assert values == [3_000_000, 30_000_000]
    assert len({e.identifier for e in fake_stripe.live_events(cid)}) == 2
    assert sent_units(fake_stripe, cid) == ledger_units()


def test_a_void_of_a_recent_event_cancels_it(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=10)):
        cid = set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    line = UsageRecord.objects.get()
    with at(H + timedelta(hours=2)):
        usage_void(record_id=line.pk, reason="refund")
    with at(H + timedelta(hours=3, minutes=1)):
        assert stripe_push().sent == 1
    cancel = MeterDelivery.objects.get(kind=DeliveryKind.CANCEL)
    assert cancel.state == MeterDeliveryState.SENT
    assert cancel.units == -30_000_000
    assert fake_stripe.live_events(cid) == []
    assert len(fake_stripe.state.adjustments) == 1
    assert sent_units(fake_stripe, cid) == ledger_units() == 0


def test_a_void_after_a_day_is_a_compensating_negative_event(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=10)):
        cid = set_up(fake_stripe)
        use(1000)
        use(200)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    first = UsageRecord.objects.order_by("pk").first()
    assert first is not None
    with at(H + timedelta(days=2)):
        usage_void(record_id=first.pk, reason="refund")
    with at(H + timedelta(days=2, hours=1, minutes=1)):
        stripe_push()
    assert sorted(e.value for e in fake_stripe.live_events(cid)) == [-30_000_000, 36_000_000]
    assert sent_units(fake_stripe, cid) == ledger_units() == 6_000_000


def test_a_refused_cancel_falls_back_to_a_compensating_event(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=10)):
        cid = set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    with at(H + timedelta(hours=2)):
        usage_void(record_id=UsageRecord.objects.get().pk, reason="refund")
    # Built as a cancel within 23 h, but sent only after Stripe's 24 h.
    with at(H + timedelta(hours=3, minutes=1)):
        from llm_budgets.billing.stripe_push import deliveries_build

        deliveries_build()
    with at(H + timedelta(hours=26)):
        stripe_push()
        stripe_push()
    assert sent_units(fake_stripe, cid) == ledger_units() == 0
    assert [e.value for e in fake_stripe.live_events(cid)] == [30_000_000, -30_000_000]


def test_a_void_before_sending_nets_out(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=10)):
        cid = set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=2)):
        usage_void(record_id=UsageRecord.objects.get().pk, reason="mistake")
    with at(H + timedelta(hours=3)):
        stripe_push()
    assert fake_stripe.live_events(cid) == []
    assert MeterDelivery.objects.get().state == MeterDeliveryState.EMPTY


def test_expiry_charges_and_late_true_ups_are_billed(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        hold = reserve_30()
    with at(H + timedelta(minutes=10)):
        # Charged 30 as an estimate. The sweep reads the database's clock unless told the
        # instant: this test's clock is time_machine's, so it names it.
        assert budgets.sweep(now=timezone.now()) == 1
        hold.commit(input_tokens=0, output_tokens=100)  # late: trued down by 27
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    kinds = sorted(BillingLine.objects.values_list("kind", flat=True))
    assert kinds == ["charge", "true_up"]
    assert sent_units(fake_stripe, cid) == ledger_units() == 3_000_000


def test_a_reset_moves_a_limit_not_money(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        set_up(fake_stripe)
        budgets.set_limit(tenant="acme", end_user="ann", amount=500, window="month")
        use(1000, end_user="ann")
        end_user_spend_reset(end_user=EndUser.objects.get(), reason="goodwill")
    reset = BillingLine.objects.get(kind="adjustment")
    assert reset.usage_record is not None
    assert reset.usage_record.cost == -30
    assert reset.amount == 0  # recorded in the outbox, bills nothing


def test_usage_before_linking_is_delivered_when_linked_older_is_reported(
    fake_stripe: StripeServer,
) -> None:
    with at(H - timedelta(days=40)):
        seed(limit="100000")
        use(1000)  # too old for Stripe by the time the tenant is linked
    with at(H - timedelta(days=3)):
        use(2000)
    assert BillingLine.objects.count() == 0
    with at(H):
        from llm_budgets.billing.setup import billing_setup

        billing_setup(event_name="llm_usage")
        cid = fake_stripe.add_customer()
        budgets.link_stripe_customer(tenant="acme", customer_id=cid, actor="ops")
        stripe_push()
    assert [e.value for e in fake_stripe.live_events(cid)] == [60_000_000]
    old = MeterDelivery.objects.get(state=MeterDeliveryState.TOO_OLD)
    assert old.amount == Decimal(30)
    assert "35 days" in old.note
    assert AuditEvent.objects.filter(action="stripe.link", actor="ops").exists()


def test_unlinking_stops_new_usage_and_keeps_what_is_owed(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        use(1000)
        budgets.unlink_stripe_customer(tenant="acme", reason="churned")
        use(500)  # after unlinking: not queued
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    assert [e.value for e in fake_stripe.live_events(cid)] == [30_000_000]
    assert AuditEvent.objects.filter(action="stripe.unlink", reason="churned").exists()
    with pytest.raises(InvalidUsage):
        budgets.unlink_stripe_customer(tenant="acme")
    # Relinked: the usage booked meanwhile (within 35 days) is delivered.
    with at(H + timedelta(hours=2)):
        budgets.link_stripe_customer(tenant="acme", customer_id=cid)
        stripe_push()
    assert sent_units(fake_stripe, cid) == ledger_units() == 45_000_000


def test_link_refuses_a_customer_id_that_is_not_one() -> None:
    seed()
    with pytest.raises(InvalidUsage) as refused:
        budgets.link_stripe_customer(tenant="acme", customer_id="acme-co")
    assert refused.value.field == "customer_id"


@pytest.mark.parametrize("fault", ["500", "429", "drop_before", "drop_after"])
def test_transient_faults_retry_and_bill_once(fake_stripe: StripeServer, fault: str) -> None:
    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        use(1000)
    fake_stripe.inject("/v1/billing/meter_events", fault, fault)
    with at(H + timedelta(hours=1, minutes=1)):
        assert stripe_push().retrying == 1
    delivery = MeterDelivery.objects.get()
    assert delivery.state == MeterDeliveryState.PENDING
    assert delivery.error_code
    # Backoff: not due again yet, then due after 10 s, then 20 s.
    with at(H + timedelta(hours=1, minutes=1, seconds=5)):
        assert stripe_push().retrying == 0
    with at(H + timedelta(hours=1, minutes=1, seconds=11)):
        assert stripe_push().retrying == 1
    with at(H + timedelta(hours=1, minutes=2)):
        assert stripe_push().sent == 1
    assert len(fake_stripe.live_events(cid)) == 1
    assert sent_units(fake_stripe, cid) == ledger_units()


def test_transient_failures_are_parked_after_the_maximum(
    fake_stripe: StripeServer, settings: object
) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "STRIPE_MAX_ATTEMPTS": 2}  # type: ignore[attr-defined]
    with at(H + timedelta(minutes=1)):
        set_up(fake_stripe)
        use(1000)
    fake_stripe.inject("/v1/billing/meter_events", "500", "500")
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    with at(H + timedelta(hours=2)):
        assert stripe_push().parked == 1
    delivery = MeterDelivery.objects.get()
    assert delivery.state == MeterDeliveryState.PARKED
    assert "2 attempts" in delivery.note


def test_a_bad_customer_is_parked_with_stripes_error_and_retried_once_fixed(
    fake_stripe: StripeServer,
) -> None:
    with at(H + timedelta(minutes=1)):
        seed(limit="100000")
        from llm_budgets.billing.setup import billing_setup

        billing_setup(event_name="llm_usage")
        budgets.link_stripe_customer(tenant="acme", customer_id="cus_missing")
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        assert stripe_push().parked == 1
    parked = MeterDelivery.objects.get()
    assert parked.state == MeterDeliveryState.PARKED
    assert "No such customer" in parked.error_message
    assert parked.request_id.startswith("req_")
    assert billing_status(parked.tenant).by_state[MeterDeliveryState.PARKED][0] == 1
    fake_stripe.add_customer("cus_missing")  # fixed in Stripe
    with at(H + timedelta(hours=1, minutes=5)):
        assert stripe_push().sent == 0  # parked rows wait for a person
        assert delivery_retry(delivery_id=parked.pk, actor="carol")
        assert stripe_push().sent == 1
    assert sent_units(fake_stripe, "cus_missing") == ledger_units()


def test_reconciliation_is_clean_then_finds_a_difference(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    with at(H + timedelta(hours=3)):
        out = StringIO()
        call_command("llm_budgets_stripe_reconcile", stdout=out)
        assert "Clean" in out.getvalue()
        fake_stripe.live_events(cid)[0].value = Decimal(1)  # Stripe lost most of it
        received = []

        def receiver(**kwargs: object) -> None:
            received.append(kwargs["run"])

        from llm_budgets.signals import stripe_reconciled

        stripe_reconciled.connect(receiver)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(transaction, "on_commit", lambda f, *a, **k: f())
                run = billing_reconcile()
        finally:
            stripe_reconciled.disconnect(receiver)
    assert not run.is_clean
    assert run.differences == 1
    assert received == [run]
    diff = run.diffs.get()
    assert (diff.delivered_units, diff.stripe_units, diff.hour) == (30_000_000, 1, H)


def test_setup_is_idempotent_and_prints_the_ids(fake_stripe: StripeServer) -> None:
    out = StringIO()
    call_command("llm_budgets_stripe_setup", stdout=out)
    call_command("llm_budgets_stripe_setup", stdout=out)
    meter = StripeMeter.objects.get()
    assert len(fake_stripe.state.meters) == 1
    assert len(fake_stripe.state.prices) == 1
    text = out.getvalue()
    assert f"meter {meter.meter_id} (created)" in text
    assert f"meter {meter.meter_id} (found)" in text
    price = fake_stripe.state.prices[meter.price_id]
    assert price["unit_amount_decimal"] == "0.0001"
    assert price["recurring"]["meter"] == meter.meter_id
    assert fake_stripe.state.meters[meter.meter_id]["default_aggregation"]["formula"] == "sum"


def test_push_without_an_api_key_says_so(settings: object) -> None:
    from django.core.management.base import CommandError

    settings.LLM_BUDGETS = {}  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="STRIPE_API_KEY"):
        call_command("llm_budgets_stripe_push")


def test_billed_so_far_counts_what_stripe_accepted(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        use(100)  # this hour is still open: not billed yet
        stripe_push()
    tenant = MeterDelivery.objects.get().tenant
    assert billed_in_period(tenant, H, H + timedelta(days=1)) == Decimal(30)
    assert billed_in_period(tenant, H + timedelta(hours=1), H + timedelta(days=1)) == 0


def test_the_demo_delivers_a_tenants_usage_exactly_once() -> None:
    from demo.stripe_demo import stripe_demo_render, stripe_demo_run

    report = stripe_demo_run()
    assert report.stripe_units == report.ledger_total * 1_000_000 > 0
    assert report.duplicates_absorbed == 1
    assert report.reconciliation == "clean"
    # Compared the demo's two hours of usage, and is dated when it ran, not an hour ahead.
    run = ReconciliationRun.objects.latest("started_at")
    assert run.started_at <= timezone.now()
    assert run.hours_checked == 2
    assert "sk_test_" in stripe_demo_render(report)


def test_a_line_committed_by_a_process_unaware_of_a_new_link_is_caught_up(
    fake_stripe: StripeServer,
) -> None:

    from llm_budgets.billing import outbox
    from llm_budgets.models import StripeCustomerLink

    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        # Another process's cache, read just before the link: it knows of no linked tenant.
        outbox.LINKED.keep(())
        try:
            use(1000)
        finally:
            outbox.linked_cache_clear()
        assert BillingLine.objects.count() == 0
    with at(H + timedelta(minutes=5)):
        assert stripe_push().queued == 1
    assert StripeCustomerLink.objects.get().caught_up_at is None  # still within the margin
    with at(H + timedelta(hours=1, minutes=1)):
        assert stripe_push().sent == 1
    assert StripeCustomerLink.objects.get().caught_up_at is not None
    assert sent_units(fake_stripe, cid) == ledger_units() == 30_000_000


def test_the_linked_tenant_cache_never_skips_a_tenant_it_knows_is_linked(
    fake_stripe: StripeServer,
) -> None:
    from llm_budgets.billing import outbox

    set_up(fake_stripe)
    outbox.linked_cache_clear()
    tenant_id = BillingLine._meta.get_field("tenant").related_model.objects.get().pk  # type: ignore[union-attr]
    assert outbox.tenant_may_be_linked(tenant_id)
    assert not outbox.tenant_may_be_linked(tenant_id + 1000)


def test_a_plan_may_bill_through_its_own_meter(fake_stripe: StripeServer) -> None:
    from llm_budgets.models import Plan, StripePlanMeter, Tenant

    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        plan = Plan.objects.create(name="pro")
        Tenant.objects.filter(external_id="acme").update(plan=plan)
        StripePlanMeter.objects.create(plan=plan, event_name="pro_usage")
        call_command("llm_budgets_stripe_setup", stdout=StringIO())
        use(1000)
    assert BillingLine.objects.get().event_name == "pro_usage"
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    [event] = fake_stripe.live_events(cid)
    assert event.event_name == "pro_usage"
    assert StripeMeter.objects.count() == 2


def test_relinking_moves_unsent_usage_to_the_new_customer(fake_stripe: StripeServer) -> None:
    with at(H + timedelta(minutes=1)):
        old = set_up(fake_stripe)
        use(1000)
        new = fake_stripe.add_customer()
        budgets.link_stripe_customer(tenant="acme", customer_id=new)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    assert fake_stripe.live_events(old) == []
    assert sent_units(fake_stripe, new) == ledger_units() == 30_000_000


def test_voiding_usage_that_was_too_old_to_bill_credits_nothing(
    fake_stripe: StripeServer,
) -> None:
    with at(H - timedelta(days=40)):
        seed(limit="100000")
        use(1000)
    with at(H):
        from llm_budgets.billing.setup import billing_setup

        billing_setup(event_name="llm_usage")
        cid = fake_stripe.add_customer()
        budgets.link_stripe_customer(tenant="acme", customer_id=cid)
        usage_void(record_id=UsageRecord.objects.get().pk, reason="goodwill")
    assert BillingLine.objects.get().amount == 0
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    assert fake_stripe.live_events(cid) == []


def test_a_reconciliation_that_cannot_reach_stripe_says_so(fake_stripe: StripeServer) -> None:
    from django.core.management.base import CommandError

    with at(H + timedelta(minutes=1)):
        set_up(fake_stripe)
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    fake_stripe.inject(
        "/v1/billing/meters/" + StripeMeter.objects.get().meter_id + "/event_summaries", "500"
    )
    with at(H + timedelta(hours=3)), pytest.raises(CommandError, match="Reconciliation failed"):
        call_command("llm_budgets_stripe_reconcile", stdout=StringIO())
    run = billing_reconcile(now=H + timedelta(hours=3))
    assert run.is_clean  # once Stripe answers again


def test_the_tenant_pages_show_billed_so_far_to_an_admin_only(fake_stripe: StripeServer) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from llm_budgets.billing.totals import billed_so_far
    from llm_budgets.models import Membership, MembershipRole, Tenant

    with at(H + timedelta(minutes=1)):
        set_up(fake_stripe)
        tenant = Tenant.objects.get(external_id="acme")
        assert billed_so_far(tenant, H, H + timedelta(days=1)) is None  # never billed: no figure
        use(1000)
    with at(H + timedelta(hours=1, minutes=1)):
        stripe_push()
    assert billed_so_far(tenant, H, H + timedelta(days=1)) == Decimal(30)

    def overview(role: str, end_user: str = "") -> str:
        user = get_user_model().objects.create_user(f"{role}-acme", password="x")
        Membership.objects.create(
            user=user, tenant=tenant, role=role, end_user_external_id=end_user
        )
        client = Client()
        client.force_login(user)
        with at(H + timedelta(hours=1, minutes=2)):
            return client.get("/usage/").content.decode()

    assert "Billed so far" in overview(MembershipRole.ADMIN)
    assert "Billed so far" not in overview(MembershipRole.MEMBER, end_user="u-1")


def test_runs_and_tags_are_billed_to_their_tenant_once(fake_stripe: StripeServer) -> None:
    """Issue 16 item 3: calls naming a run and tags bill as any call does, to the tenant's
    customer, once: charges, an expiry charge with a late true-up and a void of a run's call
    reach Stripe; a run or tag budget's spend reset moves a limit, not money; closing a run
    changes nothing already billed."""
    with at(H + timedelta(minutes=1)):
        cid = set_up(fake_stripe)
        budgets.set_limit(tenant="acme", run="*", amount=500, window="lifetime")
        budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=500, window="month")
        tagged = {"project": "alpha"}
        use(1000, run="run-1", tags=tagged)  # 30
        use(500, run="run-1")  # 15
        use(200, tags=tagged)  # 6
        late = reserve_30(run="run-2", tags=tagged)
    with at(H + timedelta(minutes=10)):
        assert budgets.sweep(now=timezone.now()) == 1  # charged 30 as an estimate
        late.commit(input_tokens=0, output_tokens=100)  # trued down to 3
        voided = UsageRecord.objects.get(reservation__run__external_id="run-1", cost=15)
        usage_void(record_id=voided.pk, reason="refund")
        run_spend_reset(tenant="acme", run="run-1", reason="goodwill")
        tag_budget = Budget.objects.get(scope=Scope.TAG)
        budget_spend_reset(budget=tag_budget, reason="goodwill")
        budgets.close_run(tenant="acme", run="run-1")
    # The void credits its 15; each reset (the run's counter, the tag's) is recorded in the
    # outbox and bills nothing.
    adjustments = BillingLine.objects.filter(kind="adjustment")
    assert sorted(line.amount for line in adjustments) == [-15, 0, 0]
    with at(H + timedelta(hours=1, minutes=1)):
        result = stripe_push()
        assert result.sent == 1
        assert stripe_push().sent == 0  # nothing twice
    # 30 + 6 + 3 billed; the voided 15 never left (netted out before sending).
    assert sent_units(fake_stripe, cid) == ledger_units() == 39_000_000
