"""Exactly once under real faults (issue 11, item 8): a pushing process killed after Stripe
recorded an event and before the outbox marked it, then a rerun; two pushing processes at once.
The fake Stripe must hold each billed fact once, and its totals equal the ledger's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone

from llm_budgets.billing.stripe_push import deliveries_build, hour_of, stripe_push
from llm_budgets.models import MeterDelivery, MeterDeliveryState
from llm_budgets.testing.fakes.stripe_server import MeterEvent, StripeServer
from tests.factories import reserve_30
from tests.services import subprocess_database_url
from tests.stripe_support import API_KEY, fake_stripe, ledger_units, set_up

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]
__all__ = ["fake_stripe"]

CHILD = Path(__file__).with_name("stripe_push_child.py")
BOUND = 120  # seconds: a bound on waiting for a child, never a timing assertion


def child(fake: StripeServer, now: object) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "STRIPE_API_KEY": API_KEY,
        "STRIPE_API_BASE": fake.base_url,
    }
    return subprocess.Popen(
        [sys.executable, str(CHILD), now.isoformat()],  # type: ignore[attr-defined]
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def usage_in_hours(fake: StripeServer, hours: int, tenants: tuple[str, ...] = ("acme",)) -> object:
    """Ledger lines in each of ``hours`` past hours for each tenant; returns the first hour."""
    first = hour_of(timezone.now()) - timedelta(hours=hours + 1)
    for index in range(hours):
        with time_machine.travel(first + timedelta(hours=index, minutes=5), tick=False):
            for tenant in tenants:
                if index == 0:
                    set_up(fake, tenant=tenant)
                reserve_30(tenant=tenant).commit(input_tokens=0, output_tokens=100 + index)
    return first


def assert_each_fact_once(fake: StripeServer, tenants: tuple[str, ...] = ("acme",)) -> None:
    delivered = MeterDelivery.objects.filter(state=MeterDeliveryState.SENT)
    identifiers = [e.identifier for e in fake.state.events]
    assert len(identifiers) == len(set(identifiers)) == delivered.count()
    assert set(identifiers) == set(delivered.values_list("identifier", flat=True))
    for tenant in tenants:
        customer = MeterDelivery.objects.filter(tenant__external_id=tenant).first()
        assert customer is not None
        assert abs(fake.total(customer.customer_id) - ledger_units(tenant)) <= 1


@pytest.mark.parametrize("answer", ["idempotent_replay", "duplicate_identifier"])
def test_a_push_killed_between_send_and_record_bills_once_on_rerun(
    fake_stripe: StripeServer, answer: str
) -> None:
    usage_in_hours(fake_stripe, 3)
    assert deliveries_build() == 3
    killed = threading.Event()
    process: list[subprocess.Popen[str]] = []

    def kill_sender(event: MeterEvent) -> None:
        # Dead before Stripe answers: the sender never learns that its event was recorded.
        if not killed.is_set():
            process[0].send_signal(signal.SIGKILL)
            process[0].wait(BOUND)
            killed.set()

    fake_stripe.on_record = kill_sender
    process.append(child(fake_stripe, timezone.now()))
    assert killed.wait(BOUND)
    assert process[0].wait(BOUND) == -signal.SIGKILL
    fake_stripe.on_record = None
    # Stripe holds the first event; our row still says pending (leased to the dead sender).
    assert len(fake_stripe.state.events) == 1
    assert MeterDelivery.objects.filter(state=MeterDeliveryState.PENDING).count() == 3
    if answer == "duplicate_identifier":
        fake_stripe.state.idempotency.clear()  # e.g. the key expired: the identifier still guards
    # The rerun is too early for the dead sender's lease: it sends the other two only.
    assert stripe_push().sent == 2
    with time_machine.travel(timezone.now() + timedelta(minutes=6), tick=False):
        assert stripe_push().sent == 1
    assert_each_fact_once(fake_stripe)
    assert len(fake_stripe.state.events) == 3
    if answer == "duplicate_identifier":
        assert MeterDelivery.objects.filter(note__contains="duplicate identifier").count() == 1


def test_two_pushing_processes_at_once_send_nothing_twice(fake_stripe: StripeServer) -> None:
    tenants = tuple(f"t{i}" for i in range(6))
    usage_in_hours(fake_stripe, 3, tenants)
    fake_stripe.delay = 0.05  # requests overlap between the two processes
    now = timezone.now()
    processes = [child(fake_stripe, now), child(fake_stripe, now)]
    outputs = [p.communicate(timeout=BOUND)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert MeterDelivery.objects.count() == 18
    assert MeterDelivery.objects.exclude(state=MeterDeliveryState.SENT).count() == 0
    assert_each_fact_once(fake_stripe, tenants)
    # What the two processes report sending adds up to each delivery once.
    sent = [int(out.split(" sent")[0].rsplit(" ", 1)[-1]) for out in outputs]
    assert sum(sent) == 18, outputs
    units = sum(MeterDelivery.objects.values_list("units", flat=True))
    assert Decimal(units) == sum((e.value for e in fake_stripe.state.events), Decimal(0))
