"""Fail closed (issue D10): when the ledger cannot be read or written in time, ``reserve`` raises
``LedgerUnavailable`` and nothing is admitted."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings

from llm_budgets.exceptions import LedgerUnavailable
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Reservation
from tests.concurrency import RowLocker
from tests.factories import reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


@contextmanager
def database_down(tmp_path: Path) -> Iterator[None]:
    """Point this thread's connection at a database that is not there: PostgreSQL on a port
    that is bound but not listening (so nothing else can take it), SQLite at a file in a
    directory that does not exist. The real settings come back on exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        if connection.vendor == "sqlite":
            unreachable = {"NAME": str(tmp_path / "missing" / "ledger.sqlite3")}
        else:
            unreachable = {"HOST": "127.0.0.1", "PORT": str(sock.getsockname()[1])}
        connection.close()
        try:
            with mock.patch.dict(connection.settings_dict, unreachable):
                yield
        finally:
            connection.close()


def test_reserve_refuses_when_the_database_is_down(tmp_path: Path) -> None:
    seed(limit="100")
    reserve_30().release()  # the counter exists and is free

    with database_down(tmp_path), pytest.raises(LedgerUnavailable) as excinfo:
        reserve_30()

    assert isinstance(excinfo.value.__cause__, OperationalError)
    assert "admission" in str(excinfo.value)
    assert excinfo.value.retry_after >= 1
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == 0
    # Back up: the same call is admitted.
    assert reserve_30().amount == Decimal(30)


@contextmanager
def patient_connection() -> Iterator[None]:
    """Make this connection's own lock wait long (SQLite's busy timeout; PostgreSQL waits
    forever by default), so only LOCK_TIMEOUT_SECONDS can cut a wait short."""
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        (before,) = cursor.execute("PRAGMA busy_timeout").fetchone()
        cursor.execute("PRAGMA busy_timeout = 600000")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(before)}")


@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 0.5})
@pytest.mark.parametrize("end_user", [None, "u-1"], ids=["tenant call", "known end user"])
def test_reserve_refuses_when_the_counter_lock_wait_is_too_long(end_user: str | None) -> None:
    seed(limit="100")
    reserve_30(end_user=end_user).release()  # the counter (and end user) exist, the lock is free
    counter = Counter.objects.get()

    # If the bound did not apply, reserve would wait for the locker's own 30 s safety timeout
    # and then be admitted: the test fails rather than hangs.
    with (
        patient_connection(),
        RowLocker([counter.pk], timeout=30),
        pytest.raises(LedgerUnavailable) as excinfo,
    ):
        reserve_30(end_user=end_user)

    # PostgreSQL: "canceling statement due to lock timeout"; SQLite: "database is locked".
    assert isinstance(excinfo.value.__cause__, OperationalError)
    assert "admission" in str(excinfo.value)
    assert Reservation.objects.count() == 1
    counter.refresh_from_db()
    assert (counter.spent, counter.reserved) == (Decimal(0), Decimal(0))
    # Once the lock is gone, the same call is admitted.
    assert reserve_30(end_user=end_user).amount == Decimal(30)
    assert counters_drift() == []


def test_commit_refuses_when_the_counter_lock_wait_is_too_long() -> None:
    """Settlement bounds its lock waits too (the bound rides on its first statement): the
    commit fails closed, changes nothing, and succeeds once the lock is gone."""
    seed(limit="100")
    hold = reserve_30(end_user="u-1")
    counter = Counter.objects.get()
    with (
        patient_connection(),
        RowLocker([counter.pk], timeout=30),
        pytest.raises(LedgerUnavailable) as excinfo,
    ):
        hold.commit(input_tokens=0, output_tokens=100)
    assert isinstance(excinfo.value.__cause__, OperationalError)
    assert "commit" in str(excinfo.value)
    counter.refresh_from_db()
    assert (counter.spent, counter.reserved) == (Decimal(0), Decimal(30))
    assert Reservation.objects.get().state == "held"
    assert hold.commit(input_tokens=0, output_tokens=100).cost == Decimal(3)
    counter.refresh_from_db()
    assert (counter.spent, counter.reserved) == (Decimal(3), Decimal(0))
    assert counters_drift() == []


class TableLocker:
    """Holds ``LOCK TABLE ... IN EXCLUSIVE MODE`` on its own thread and connection until
    released, as a migration's ``ALTER TABLE`` queued behind a long transaction would."""

    def __init__(self, table: str, *, timeout: float = 30) -> None:
        self.table, self.timeout = table, timeout
        self.locked, self.release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f'LOCK TABLE "{self.table}" IN EXCLUSIVE MODE')
                self.locked.set()
                self.release.wait(self.timeout)  # bounded, so a test fails rather than hangs
        finally:
            self.locked.set()
            connections.close_all()

    def __enter__(self) -> TableLocker:
        self._thread.start()
        assert self.locked.wait(self.timeout), "the locker never took its lock"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()
        self._thread.join(self.timeout)


@pytest.mark.parametrize("step", ["reserve", "commit"])
def test_a_table_lock_wait_is_bounded_too(step: str, on_postgres: bool) -> None:
    """A statement waits for its table locks before it runs: the bound must be set by an
    earlier statement of the transaction, or a queued ALTER TABLE would hang every call."""
    if not on_postgres:
        pytest.skip("SQLite has no table locks (the database write lock is covered above)")
    seed(limit="100")
    hold = reserve_30(end_user="u-1")
    table = Counter._meta.db_table if step == "reserve" else Reservation._meta.db_table
    call = {
        "reserve": lambda: reserve_30(end_user="u-1"),
        "commit": lambda: hold.commit(input_tokens=0, output_tokens=100),
    }[step]
    with TableLocker(table), pytest.raises(LedgerUnavailable) as excinfo:
        call()
    assert "lock timeout" in str(excinfo.value)
    assert Reservation.objects.count() == 1
    assert Reservation.objects.get().state == "held"
    assert counters_drift() == []
