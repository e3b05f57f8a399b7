"""Temporary raises, end-user resets and voided lines (issue 5, item 5 services): audited,
expiring by themselves, compensating ledger entries only, conservation kept."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from uuid import UUID

import pytest
import time_machine
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine.adjustments import end_user_spend_reset, usage_void
from llm_budgets.engine.settlement import (
    reservation_commit,
    reservation_release,
    reservations_sweep,
)
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    AuditEvent,
    Budget,
    Counter,
    EndUser,
    Reservation,
    UsageKind,
    UsageRecord,
)
from llm_budgets.reads.overviews import adjustment_notes
from tests.api import BASE, client_for, new_key
from tests.factories import reserve_30, seed

# Moves time with time_machine: admission follows this process's clock (conftest).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("application_clock")]


def _tenant_budget() -> Budget:
    return Budget.objects.get(scope="tenant")


def test_a_temporary_raise_adds_room_until_it_expires_by_itself() -> None:
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        seed(limit="60")
        reserve_30().commit(input_tokens=0, output_tokens=1000)
        reserve_30().commit(input_tokens=0, output_tokens=1000)
        with pytest.raises(BudgetExceeded):
            reserve_30()
        budget_raise_grant(
            budget=_tenant_budget(),
            amount=Decimal("30"),
            until=start + timedelta(hours=1),
            reason="launch day",
            actor="carol",
        )
        assert budgets.status(tenant="acme")[0].limit == Decimal(90)
        reserve_30().commit(input_tokens=0, output_tokens=1000)
    with time_machine.travel(start + timedelta(hours=1), tick=False):
        status = budgets.status(tenant="acme")[0]
        assert (status.limit, status.raised, status.remaining) == (Decimal(60), 0, 0)
        with pytest.raises(BudgetExceeded) as refused:
            reserve_30(max_output_tokens=1)
        assert refused.value.limit == Decimal(60)
    event = AuditEvent.objects.get(action="budget.raise")
    assert (event.actor, event.reason) == ("carol", "launch day")
    assert event.after is not None
    assert event.after["raise"] == "30"


@pytest.mark.parametrize(
    ("amount", "hours", "reason", "field"),
    [("0", 1, "x", "amount"), ("5", -1, "x", "until"), ("5", 1, " ", "reason")],
)
def test_a_bad_raise_is_refused(amount: str, hours: int, reason: str, field: str) -> None:
    seed()
    with pytest.raises(InvalidUsage) as bad:
        budget_raise_grant(
            budget=_tenant_budget(),
            amount=amount,
            until=timezone.now() + timedelta(hours=hours),
            reason=reason,
        )
    assert bad.value.field == field


def test_resetting_an_end_user_adds_a_compensating_line_on_their_counter_only() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    with pytest.raises(BudgetExceeded):
        reserve_30(end_user="u-1")
    user = EndUser.objects.get(external_id="u-1")
    lines_before = UsageRecord.objects.count()
    (line,) = end_user_spend_reset(end_user=user, reason="goodwill", actor="carol")
    assert (line.kind, line.cost, line.reservation_id) == (UsageKind.ADJUSTMENT, Decimal(-30), None)
    assert UsageRecord.objects.count() == lines_before + 1  # nothing deleted
    spent = {c.budget.scope: c.spent for c in Counter.objects.select_related("budget")}
    assert spent == {"tenant": Decimal(30), "end_user": Decimal(0)}
    reserve_30(end_user="u-1").release()
    assert counters_drift() == []
    event = AuditEvent.objects.get(action="end_user.reset_spend")
    assert (event.actor, event.reason) == ("carol", "goodwill")


def test_voiding_a_line_compensates_every_counter_it_was_charged_to_once() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=500)
    charge = UsageRecord.objects.get()
    adjustment = usage_void(record_id=charge.pk, reason="provider refunded", actor="carol")
    assert (adjustment.kind, adjustment.cost, adjustment.voids_id) == (
        UsageKind.ADJUSTMENT,
        Decimal(-15),
        charge.pk,
    )
    assert {c.spent for c in Counter.objects.all()} == {Decimal(0)}
    assert counters_drift() == []
    with pytest.raises(InvalidUsage):
        usage_void(record_id=charge.pk, reason="again")
    with pytest.raises(InvalidUsage):
        usage_void(record_id=adjustment.pk, reason="void the void")
    event = AuditEvent.objects.get(action="usage.void")
    assert event.before is not None
    assert Decimal(event.before["cost"]) == 15


def test_a_line_of_an_expired_hold_cannot_be_voided_until_it_settles() -> None:
    seed()
    hold = reserve_30()
    reservations_sweep(now=hold.expires_at)
    with pytest.raises(InvalidUsage):
        usage_void(record_id=UsageRecord.objects.get().pk, reason="x")


def _spent() -> dict[str, Decimal]:
    return {c.budget.scope: c.spent for c in Counter.objects.select_related("budget")}


def _floors() -> list[tuple[str, Decimal]]:
    """The floor rule's lines: positive adjustments of one counter (a reset's are negative)."""
    return [
        (line.counter.budget.scope, line.cost)  # type: ignore[union-attr]
        for line in UsageRecord.objects.filter(counter__isnull=False, cost__gt=0)
    ]


def test_voiding_after_a_reset_refunds_the_tenant_and_stops_the_reset_counter_at_zero() -> None:
    # Issue 22 item 1: the floor rule applies to voids too (a void used to be refused).
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    end_user_spend_reset(end_user=EndUser.objects.get(), reason="goodwill")
    usage_void(record_id=UsageRecord.objects.get(kind="charge").pk, reason="refund")
    assert _spent() == {"tenant": Decimal(0), "end_user": Decimal(0)}
    assert _floors() == [("end_user", Decimal(30))]
    assert counters_drift() == []
    event = AuditEvent.objects.get(action="usage.void")
    assert event.after is not None
    assert list(event.after["floored"].values()) == ["30.0000000000"]


def _expired_hold_then_reset(*, spent_since: int = 0) -> UUID:
    """An end user's hold of 30 charged as an estimate by the sweep, then its period spend
    reset by support; then ``spent_since`` of new, committed spend."""
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    hold = reserve_30(end_user="u-1")
    reservations_sweep(now=hold.expires_at)
    end_user_spend_reset(end_user=EndUser.objects.get(), reason="goodwill")
    if spent_since:  # output costs 0.03 a token
        reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=spent_since * 100 // 3)
    assert _spent()["end_user"] == spent_since
    return hold.id


@pytest.mark.parametrize("backend", ["service", "rest"])
@pytest.mark.parametrize(
    ("settle", "tenant_spent"), [("commit", Decimal(3)), ("release", Decimal(0))]
)
def test_a_late_settlement_after_a_spend_reset_settles(
    backend: str, settle: str, tenant_spent: Decimal
) -> None:
    """Issue 22 item 1: the late true-up (to 3, or a refund to 0) used to fail on the end user's
    counter, already at zero (IntegrityError, a 500 over REST), leaving the tenant charged the
    whole estimate. Now the tenant counter takes the true cost; the reset counter stops at zero
    and a line of its own records the 27 (or 30) it did not take back."""
    rid = _expired_hold_then_reset()
    if backend == "rest":
        body = {"input_tokens": 0, "output_tokens": 100} if settle == "commit" else {}
        client = client_for(new_key("acme"))
        response = client.post(f"{BASE}reservations/{rid}/{settle}", body, format="json")
        assert response.status_code == 200, response.content
    elif settle == "commit":
        reservation_commit(rid, input_tokens=0, output_tokens=100)
    else:
        reservation_release(rid)
    assert Reservation.objects.get(pk=rid).state == settle.replace("commit", "committed").replace(
        "release", "released"
    )
    assert _spent() == {"tenant": tenant_spent, "end_user": Decimal(0)}
    assert _floors() == [("end_user", Decimal(30) - tenant_spent)]
    assert counters_drift() == []
    # Staff see why: an audit row names the floor line (the support pages' note for it).
    (floor,) = UsageRecord.objects.filter(counter__isnull=False, cost__gt=0)
    audit = AuditEvent.objects.get(action="settlement.floor")
    assert audit.after is not None
    assert audit.after["lines"] == [floor.pk]
    assert adjustment_notes([floor]) == {floor.pk: audit}


def test_the_floor_stops_at_zero_even_with_spend_since_the_reset() -> None:
    """The documented cost of the rule: a counter holds no per-call breakdown, so a refund after
    a reset also gives back spend made since, up to the refund (docs/limits.md)."""
    rid = _expired_hold_then_reset(spent_since=9)
    reservation_release(rid)
    assert _spent() == {"tenant": Decimal(9), "end_user": Decimal(0)}
    assert _floors() == [("end_user", Decimal(21))]
    assert counters_drift() == []


def test_settling_again_after_a_void_still_returns_the_first_result() -> None:
    """A retried commit gets the first commit's answer, whatever staff voided since (the
    extended state machine found a void turning the replayed cost to 0)."""
    seed(limit="1000")
    hold = reserve_30()
    first = reservation_commit(hold.id, input_tokens=0, output_tokens=100)
    usage_void(record_id=UsageRecord.objects.get().pk, reason="provider refunded")
    assert reservation_commit(hold.id, input_tokens=0, output_tokens=100) == first
    assert first.cost == Decimal(3)


def test_a_refund_line_cannot_be_voided() -> None:
    """Issue 22: voiding a downward true-up would charge its amount again, past a limit whose
    room other calls may have taken since (the state machine found it)."""
    seed(limit="1000")
    hold = reserve_30()
    reservations_sweep(now=hold.expires_at)
    reservation_commit(hold.id, input_tokens=0, output_tokens=100)  # 30 estimated, 3 true
    refund = UsageRecord.objects.get(kind=UsageKind.TRUE_UP)
    assert refund.cost == Decimal(-27)
    with pytest.raises(InvalidUsage, match="refund") as refused:
        usage_void(record_id=refund.pk, reason="x")
    assert refused.value.field == "record_id"
    assert Counter.objects.get().spent == Decimal(3)
    void = usage_void(record_id=UsageRecord.objects.get(kind=UsageKind.CHARGE).pk, reason="r")
    # The call nets 3 (30 estimated, 27 refunded): its void gives back 3, not the estimate's 30.
    assert void.cost == Decimal(-3)
    assert Counter.objects.get().spent == Decimal(0)
    assert sum(line.cost for line in UsageRecord.objects.spend()) == 0
    assert counters_drift() == []


def test_a_call_refunded_by_a_late_release_cannot_be_refunded_again_by_a_void() -> None:
    """Review finding: an expired hold charged its estimate, then released late (refunded in
    full); voiding the estimate gave the tenant the estimate a second time, understating the
    tenant's and the global counters so admission could pass their limits unrecorded."""
    seed(limit="1000")
    hold = reserve_30()
    reservations_sweep(now=hold.expires_at)
    reservation_release(hold.id)
    assert sum(line.cost for line in UsageRecord.objects.spend()) == 0
    estimate = UsageRecord.objects.get(kind=UsageKind.CHARGE)
    with pytest.raises(InvalidUsage, match="nothing left to void") as refused:
        usage_void(record_id=estimate.pk, reason="provider refunded")
    assert refused.value.field == "record_id"
    assert not UsageRecord.objects.filter(voids=estimate).exists()
    assert Counter.objects.get().spent == 0
    assert counters_drift() == []


def test_a_voids_reversal_carries_the_originals_tags_and_pricing_basis() -> None:
    """Issue 22 item 10: every line is built in one place; the reversal of a void used to drop
    the tags and the pricing basis, so totals by tag did not cancel."""
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1", tags={"project": "alpha"}).commit(input_tokens=0, output_tokens=500)
    charge = UsageRecord.objects.get()
    UsageRecord.objects.filter(pk=charge.pk).update(pricing_basis="fixed")
    charge.refresh_from_db()
    reversal = usage_void(record_id=charge.pk, reason="provider refunded")
    reversal.refresh_from_db()
    identity = ["tenant_id", "end_user_id", "run_id", "provider", "model", "price_id"]
    assert [getattr(reversal, f) for f in identity] == [getattr(charge, f) for f in identity]
    assert (reversal.tags, reversal.pricing_basis) == ({"project": "alpha"}, "fixed")
    by_tag = UsageRecord.objects.filter(tags__project="alpha").values_list("cost", flat=True)
    assert sum(by_tag, Decimal(0)) == 0


def test_resetting_an_end_user_resets_its_share_of_each_end_user_budgets_only() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("50"), window="day")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    reserve_30(end_user="u-2").commit(input_tokens=0, output_tokens=1000)
    (line,) = end_user_spend_reset(end_user=EndUser.objects.get(external_id="u-1"), reason="x")
    assert line.cost == Decimal(-30)
    shares = {
        c.end_user.external_id: c.spent
        for c in Counter.objects.filter(end_user__isnull=False).select_related("end_user")
    }
    assert shares == {"u-1": Decimal(0), "u-2": Decimal(30)}
    assert Counter.objects.get(budget__scope="tenant").spent == Decimal(60)
    reserve_30(end_user="u-1").release()  # u-1 has its room back
    assert counters_drift() == []


def test_resetting_an_end_user_on_a_budget_at_customer_price_writes_a_valid_line() -> None:
    # Regression: the adjustment line carried only customer_cost, leaving cost NULL
    # (IntegrityError). It counts at customer price only: cost 0, customer_cost -spent.
    seed(limit="1000")
    budgets.set_limit(
        tenant="acme", end_user="u-1", amount=Decimal("50"), window="month", unit="customer_price"
    )
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    (line,) = end_user_spend_reset(end_user=EndUser.objects.get(), reason="goodwill")
    assert (line.kind, line.cost, line.customer_cost) == (
        UsageKind.ADJUSTMENT,
        Decimal(0),
        Decimal(-30),
    )
    assert Counter.objects.get(budget__scope="end_user").spent == 0
    assert counters_drift() == []
