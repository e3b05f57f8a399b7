"""UNCERTAIN reservations: the hold stays counted until usage arrives or the reconcile job
settles it by rule after a maximum age."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.engine.settlement import (
    reservation_commit,
    reservation_mark_uncertain,
    reservation_release,
    reservations_reconcile,
    reservations_sweep,
)
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Reservation, ReservationState, UsageRecord
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db

HOUR = 60 * 60


def _counter() -> Counter:
    return Counter.objects.get()


def test_marking_uncertain_keeps_the_hold_counted_and_out_of_the_sweep() -> None:
    seed()
    hold = reserve_30(ttl=5)
    assert reservation_mark_uncertain(hold.id) == ReservationState.UNCERTAIN
    assert _counter().reserved == Decimal(30)
    # Long past its TTL the sweep leaves it alone: only the reconcile rule settles it.
    assert reservations_sweep(now=timezone.now() + timedelta(hours=1)) == 0
    assert Reservation.objects.get().state == ReservationState.UNCERTAIN
    assert counters_drift() == []


def test_marking_a_settled_reservation_changes_nothing() -> None:
    seed()
    hold = reserve_30()
    hold.release()
    assert reservation_mark_uncertain(hold.id) == ReservationState.RELEASED


def test_real_usage_settles_an_uncertain_hold() -> None:
    seed()
    hold = reserve_30()
    reservation_mark_uncertain(hold.id)
    result = reservation_commit(hold.id, input_tokens=0, output_tokens=500)
    assert result.state == ReservationState.COMMITTED
    assert result.cost == Decimal(15)
    counter = _counter()
    assert (counter.spent, counter.reserved) == (Decimal(15), Decimal(0))
    assert counters_drift() == []


def test_release_drops_an_uncertain_hold() -> None:
    seed()
    hold = reserve_30()
    reservation_mark_uncertain(hold.id)
    assert reservation_release(hold.id) == ReservationState.RELEASED
    assert _counter().reserved == Decimal(0)
    assert counters_drift() == []


def test_reconcile_waits_for_the_maximum_age() -> None:
    seed()
    hold = reserve_30()
    now = timezone.now()
    reservation_mark_uncertain(hold.id, now=now)
    with override_settings(LLM_BUDGETS={"UNCERTAIN_MAX_AGE_SECONDS": HOUR}):
        assert reservations_reconcile(now=now + timedelta(minutes=59)) == 0
        assert Reservation.objects.get().state == ReservationState.UNCERTAIN
        assert reservations_reconcile(now=now + timedelta(hours=1)) == 1
    assert Reservation.objects.get().state == ReservationState.COMMITTED


def test_reconcile_charge_rule_charges_the_hold_as_estimated() -> None:
    seed()
    hold = reserve_30()
    reservation_mark_uncertain(hold.id)
    assert reservations_reconcile(now=timezone.now() + timedelta(days=1)) == 1
    line = UsageRecord.objects.get()
    assert (line.cost, line.is_estimated) == (Decimal(30), True)
    counter = _counter()
    assert (counter.spent, counter.reserved) == (Decimal(30), Decimal(0))
    # Settled is settled: running again changes nothing, a late commit returns the settlement.
    assert reservations_reconcile(now=timezone.now() + timedelta(days=2)) == 0
    assert budgets.commit(hold.id, input_tokens=0, output_tokens=10).cost == Decimal(30)
    assert counters_drift() == []


@override_settings(LLM_BUDGETS={"UNCERTAIN_SETTLE_RULE": "release"})
def test_reconcile_release_rule_drops_the_hold() -> None:
    seed()
    hold = reserve_30()
    reservation_mark_uncertain(hold.id)
    call_command("llm_budgets_reconcile_uncertain", stdout=StringIO())
    assert Reservation.objects.get().state == ReservationState.UNCERTAIN  # not old enough
    assert reservations_reconcile(now=timezone.now() + timedelta(days=1)) == 1
    assert Reservation.objects.get().state == ReservationState.RELEASED
    assert not UsageRecord.objects.exists()
    assert _counter().reserved == Decimal(0)
    assert counters_drift() == []
