"""Where the optional parts meet the ledger (``llm_budgets.hooks``, issue #40 item 3): what a part
writes commits or rolls back with the ledger line it belongs to, and a host without a part writes
none of its rows. That the core imports no part is ``make lint``'s import contract
(``[tool.importlinter]`` in pyproject.toml)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from llm_budgets import budgets, hooks
from llm_budgets.alerts.endpoints import endpoint_create
from llm_budgets.models import (
    AlertEvent,
    BillingLine,
    Counter,
    Reservation,
    ReservationState,
    UsageRecord,
)
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def without_parts() -> Iterator[None]:
    """A host without the Stripe and alerts parts: their hooks unregistered, then restored."""
    removed = {name: hooks.hooks_unregister(name) for name in ("stripe", "alerts")}
    try:
        yield
    finally:
        for name, part in removed.items():
            if part is not None:
                hooks.hooks_register(name, part)


def _linked_and_subscribed() -> None:
    """A tenant whose lines are billed to Stripe and whose kill switches alert an endpoint."""
    seed()
    budgets.link_stripe_customer(tenant="acme", customer_id="cus_hooks")
    endpoint_create(
        tenant=None,
        kind="webhook",
        target="https://hooks.example.com/x",
        event_types=["kill_switch.tripped"],
    )


def _charge_and_trip() -> None:
    reserve_30(end_user="u1").commit(input_tokens=0, output_tokens=1000)
    budgets.trip(tenant="acme", reason="hooks test")


def test_with_the_parts_a_charge_and_a_trip_write_their_rows() -> None:
    _linked_and_subscribed()
    _charge_and_trip()
    assert BillingLine.objects.count() == 1
    assert AlertEvent.objects.filter(type="kill_switch.tripped").count() == 1


@pytest.mark.usefixtures("without_parts")
def test_a_host_without_the_parts_charges_and_writes_none_of_their_rows() -> None:
    _linked_and_subscribed()
    _charge_and_trip()
    assert UsageRecord.objects.count() == 1  # the core's own line
    assert BillingLine.objects.count() == 0
    assert AlertEvent.objects.count() == 0


class _FailingAfterCharge(hooks.LedgerHooks):
    def acts_after_charge(self, tenant_id: int) -> bool:
        return True

    def after_charge(self, tenant_id: int, now: datetime) -> None:
        raise RuntimeError("the part failed after the line was written")


def test_a_part_failing_in_the_transaction_rolls_the_line_back_with_it() -> None:
    seed()
    hold = reserve_30(end_user="u1")
    spent_before = sorted(Counter.objects.values_list("spent", "reserved"))
    hooks.hooks_register("failing", _FailingAfterCharge())
    try:
        with pytest.raises(RuntimeError, match="the part failed"):
            hold.commit(input_tokens=0, output_tokens=1000)
        assert UsageRecord.objects.count() == 0
        assert Reservation.objects.get().state == ReservationState.HELD
        assert sorted(Counter.objects.values_list("spent", "reserved")) == spent_before
    finally:
        hooks.hooks_unregister("failing")
    hold.commit(input_tokens=0, output_tokens=1000)
    assert UsageRecord.objects.count() == 1


def test_registering_a_name_again_replaces_its_hooks() -> None:
    first, second = hooks.LedgerHooks(), hooks.LedgerHooks()
    hooks.hooks_register("twice", first)
    hooks.hooks_register("twice", second)
    try:
        assert hooks.hooks_registered()["twice"] is second
    finally:
        hooks.hooks_unregister("twice")
