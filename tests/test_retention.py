"""Retention: uncharged reservations go after the configured age; ledger lines never do."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from llm_budgets.engine.settlement import reservation_release, reservations_sweep
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.jobs.retention import reservations_purge
from llm_budgets.models import Reservation, ReservationHold, ReservationState, UsageRecord
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


def _states() -> list[str]:
    return sorted(Reservation.objects.values_list("state", flat=True))


@override_settings(LLM_BUDGETS={"RETENTION_RELEASED_DAYS": 30})
def test_only_old_uncharged_reservations_are_purged() -> None:
    seed(limit="1000")
    released = reserve_30()
    released.release()
    committed = reserve_30()
    committed.commit(input_tokens=0, output_tokens=10)
    expired_charged = reserve_30(ttl=1)
    reservations_sweep(now=timezone.now() + timedelta(seconds=5))  # charged as estimated
    refunded = reserve_30(ttl=1)
    reservations_sweep(now=timezone.now() + timedelta(seconds=5))
    reservation_release(refunded.id)  # has a charge and a negative true-up line
    reserve_30()  # still held
    lines = UsageRecord.objects.count()

    assert reservations_purge(now=timezone.now() + timedelta(days=29)) == 0
    assert reservations_purge(now=timezone.now() + timedelta(days=31)) == 1
    assert not Reservation.objects.filter(pk=released.id).exists()
    assert not ReservationHold.objects.filter(reservation_id=released.id).exists()
    assert Reservation.objects.filter(pk=expired_charged.id).exists()
    assert _states() == [
        ReservationState.COMMITTED,
        ReservationState.EXPIRED,
        ReservationState.HELD,
        ReservationState.RELEASED,  # the refunded one: ledger lines refer to it
    ]
    assert UsageRecord.objects.count() == lines
    assert counters_drift() == []


@override_settings(LLM_BUDGETS={"EXPIRED_HOLD_POLICY": "release", "RETENTION_RELEASED_DAYS": 1})
def test_expired_without_charge_is_purged_in_batches_by_the_command() -> None:
    seed(limit="1000")
    for _ in range(3):
        reserve_30(ttl=1)
    reservations_sweep(now=timezone.now() + timedelta(seconds=5))
    assert reservations_purge(now=timezone.now() + timedelta(days=2), batch_size=2) == 3
    assert not Reservation.objects.exists()
    out = StringIO()
    call_command("llm_budgets_purge", stdout=out)
    assert "Purged 0" in out.getvalue()


def test_old_refusal_records_are_purged() -> None:
    from llm_budgets.exceptions import BudgetExceeded
    from llm_budgets.jobs.retention import refusals_purge
    from llm_budgets.models import Refusal

    seed(limit="50")
    reserve_30()
    with pytest.raises(BudgetExceeded):
        reserve_30()
    assert Refusal.objects.count() == 1
    assert refusals_purge(now=timezone.now() + timedelta(days=89)) == 0
    assert refusals_purge(now=timezone.now() + timedelta(days=91)) == 1
    assert not Refusal.objects.exists()
    assert Reservation.objects.count() == 1  # refusals only
