"""A ledger transaction that PostgreSQL rolls back as a deadlock's victim is run again, not
refused (``db.boundary.retrying_deadlocks``).

Admission and settlement lock counters in pk order, but PostgreSQL's ``SKIP LOCKED`` stripe pick
can still wait while following a row's update chain, and so close a cycle (seen in CI at a
nearly full hot cap). Here the cycle is made on purpose, with a real second transaction: it holds
the call's last counter, waits until the call waits on it, then asks for the call's first
counter. The call's ``deadlock_timeout`` expires first, so it is the victim; the other one's is
a minute, so it never is."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction

from llm_budgets import budgets
from llm_budgets.models import Counter
from tests.concurrency import lock_waited, patient_lock_waits
from tests.factories import price_fake, reserve_30

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


@pytest.fixture(autouse=True)
def postgres_caps(on_postgres: bool) -> Iterator[None]:
    if not on_postgres:
        pytest.skip("SQLite has one write lock, taken at BEGIN: no lock cycle can form")
    price_fake()
    budgets.set_limit(amount=Decimal(1000), window="month")
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    with patient_lock_waits():
        yield


def _counters() -> tuple[int, int]:
    """The first and last counter (pk order) a call of acme's end user ``u`` locks."""
    reserve_30(end_user="u").release()  # the counters exist
    ids = list(Counter.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ids) >= 2, ids
    return ids[0], ids[-1]


def _cycle(first: int, last: int, started: threading.Event, done: list[str]) -> None:
    """The other transaction: hold ``last``, wait for the call to wait on it, take ``first``."""

    def lock(pk: int) -> None:
        cursor.execute(f"SELECT id FROM {Counter._meta.db_table} WHERE id = %s FOR UPDATE", [pk])

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL deadlock_timeout = '60s'")
            lock(last)
            started.set()
            if not lock_waited(others_only=True):
                done.append("the call never waited on the held counter")
                return
            lock(first)  # the cycle: the call's deadlock check rolls the call back
        done.append("committed")
    finally:
        connections.close_all()


def _with_cycle(call: Callable[[], object]) -> object:
    first, last = _counters()
    started, done = threading.Event(), []
    other = threading.Thread(target=_cycle, args=(first, last, started, done))
    other.start()
    assert started.wait(30)
    try:
        return call()
    finally:
        other.join(60)
        assert done == ["committed"]


def test_an_admission_chosen_as_a_deadlock_victim_is_admitted_on_its_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_budgets")
    hold = _with_cycle(lambda: reserve_30(end_user="u"))
    assert isinstance(hold, budgets.Hold)
    assert "admission was a deadlock's victim; running it again (1 of 2)" in caplog.text
    assert sum(c.reserved for c in Counter.objects.all()) == 2 * Decimal(30)  # global + tenant


def test_a_release_chosen_as_a_deadlock_victim_is_released_on_its_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_budgets")
    hold = reserve_30(end_user="u")
    assert _with_cycle(hold.release) == "released"
    assert "reservation_release was a deadlock's victim; running it again" in caplog.text
    assert sum(c.reserved for c in Counter.objects.all()) == 0
