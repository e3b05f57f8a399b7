"""The async twins under a real ASGI server (issue #31, item 3): uvicorn, one worker, serving the
test project's async views (tests/asgi_views.py) on the test database. The seed race and the
near-limit scenario give the sync path's exact counts (tests/test_seed_race.py,
tests/test_concurrency.py); a client that goes away mid-admission or mid-stream leaves every hold
settled or uncertain, never held.

Every wait below is for a state (a row, a lock wait, a log line), bounded by a deadline; none
asserts how long anything took."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, connections, transaction

from llm_budgets import budgets
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Refusal, Reservation
from tests.concurrency import overspent_counters
from tests.factories import reserve_30, seed
from tests.servers import WebProcess, asgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]

PATIENT = {"LOCK_TIMEOUT_SECONDS": 30}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WebProcess]:
    with asgi_server(tmp_path, llm_budgets=PATIENT) as web:
        yield web


def until(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Wait for ``condition()`` to be true (a state, not a duration); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"not seen within {timeout}s: {what}")


def together(url: str, count: int) -> list[httpx.Response]:
    """``count`` requests to ``url`` at once, from one event loop."""

    async def send() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            return list(await asyncio.gather(*(http.get(url) for _ in range(count))))

    return asyncio.run(send())


def _assert_consistent() -> None:
    assert counters_drift() == []
    assert overspent_counters() == []


@pytest.mark.parametrize("calls", [10, 30])
def test_async_views_admit_exactly_what_fits(server: WebProcess, calls: int) -> None:
    seed(limit="100")
    answers = together(f"{server.url}/reserve?tenant=acme", calls)
    statuses = [answer.status_code for answer in answers]
    assert (statuses.count(200), statuses.count(429)) == (3, calls - 3), statuses
    assert Counter.objects.get().reserved == Decimal(90)
    assert Reservation.objects.count() == 3
    _assert_consistent()


def test_one_idempotency_key_near_the_limit_is_one_hold_through_async_views(
    server: WebProcess,
) -> None:
    seed(limit="50")
    answers = together(f"{server.url}/reserve?tenant=acme&key=req-1", 10)
    assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert Refusal.objects.count() == 0
    assert Counter.objects.get().reserved == Decimal(30)
    _assert_consistent()


def _settled(hold_id: str) -> str | None:
    state = Reservation.objects.get(pk=hold_id).state
    return None if state == "held" else str(state)


@pytest.mark.parametrize(
    ("commit", "ends"),
    [("1", {"committed"}), ("0", {"uncertain", "released"})],
    ids=["view commits what it sent", "with-block policy"],
)
def test_a_client_gone_mid_stream_leaves_the_hold_settled(
    server: WebProcess, commit: str, ends: set[str]
) -> None:
    seed(limit="100")
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{server.url}/stream?commit={commit}") as response,
    ):
        lines = response.iter_lines()
        hold_id = next(lines)
        assert next(lines) == "chunk"  # streaming: the provider's chunks flow
        assert Reservation.objects.get(pk=hold_id).state == "held"
    # The connection is closed: uvicorn sends http.disconnect, Django cancels the body.
    assert until(lambda: _settled(hold_id), "the hold settled") in ends
    counter = Counter.objects.get()
    if commit == "1":
        assert counter.reserved == 0
        assert counter.spent > 0
    _assert_consistent()


def test_a_client_gone_mid_admission_leaves_no_hold(server: WebProcess) -> None:
    """The admission is blocked on the counter's row lock (held here) when the client goes
    away: Django cancels the view; the admission runs to its end once the lock is free, and the
    hold it took, which no one received, is released."""
    if connection.vendor != "postgresql":
        pytest.skip("a row lock to hold admission in place: PostgreSQL")
    seed(limit="100")
    reserve_30().release()  # the counter row exists
    locked, unlock = threading.Event(), threading.Event()

    def locker() -> None:
        try:
            with transaction.atomic():
                list(Counter.objects.select_for_update())
                locked.set()
                assert unlock.wait(60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=locker)
    holder.start()
    try:
        assert locked.wait(30)
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"GET /reserve?tenant=acme HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            until(_admission_waits_on_a_lock, "the admission waiting on the counter lock")
        until(
            lambda: "cancelled while admitting" in server.log.read_text(),
            "the view's task cancelled",
        )
    finally:
        unlock.set()
        holder.join(60)
    # One query per look: two (any held? how many?) could straddle the admission's commit and
    # see its hold neither as held nor as missing.
    until(
        lambda: (
            sorted(Reservation.objects.values_list("state", flat=True)) == ["released", "released"]
        ),
        "the admission finished and its hold released",
    )
    assert Counter.objects.get().reserved == 0
    _assert_consistent()


def _admission_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def test_status_and_settle_through_the_twins_after_the_race(server: WebProcess) -> None:
    # The holds the async views took are ordinary holds: the sync API settles them.
    seed(limit="100")
    answers = together(f"{server.url}/reserve?tenant=acme", 4)
    for answer in answers:
        if answer.status_code == 200:
            budgets.commit(answer.json()["id"], input_tokens=0, output_tokens=100)
    assert budgets.status(tenant="acme")[0].spent == Decimal(9)
    _assert_consistent()
