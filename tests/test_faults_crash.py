"""Crashes of our own processes (issue #17 item 3): a web process killed with SIGKILL while it
holds reservations, and while a request is inside its transaction, at every message of it.

What must hold: nothing half-written (the database rolls the open transaction back when the
connection goes); conservation; every hold the dead process left ends settled by the sweep once
its TTL has passed; nothing is charged twice. Marked ``faults`` (``make test-faults``);
PostgreSQL only (the proxy sits on its TCP connection).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, connections
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.models import Counter, Reservation, ReservationState, UsageRecord
from llm_budgets.testing.faultproxy import FaultProxy
from tests.api import BASE, new_key, reserve_body
from tests.concurrency import RowLocker, patient_lock_waits
from tests.factories import reserve_30, seed
from tests.servers import web_processes
from tests.test_faults_db import invariants, lease_passes, via

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

TALLY: Tally[str] = Tally()
# Kill at every STRIDE-th message: 2 in CI (reserve at odd, commit at even messages, about a
# minute each); LLMB_FAULT_STRIDE=1 kills at every one (docs/reliability.md).
STRIDE = int(os.environ.get("LLMB_FAULT_STRIDE", "2"))


@pytest.fixture(autouse=True, scope="module")
def _write_tally() -> Iterator[None]:
    yield
    out = Path(__file__).resolve().parent.parent / "var" / "faults-tally-crash.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(sorted(TALLY.items())), indent=2))


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    if connection.vendor != "postgresql":
        pytest.skip("the fault proxy sits on PostgreSQL's TCP connection")
    db = connection.settings_dict
    with FaultProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as running:
        yield running


def headers(key: str, idem: str) -> dict[str, str]:
    return {"Authorization": f"Api-Key {key}", "Idempotency-Key": idem}


def sweep_after_ttl(ttl: int) -> int:
    """The sweep as it runs once TTL + one sweep interval have passed (``now`` moved, no sleep)."""
    return budgets.sweep(now=timezone.now() + timedelta(seconds=ttl + 60))


def test_holds_of_a_killed_web_process_are_swept(tmp_path: Path, proxy: FaultProxy) -> None:
    seed(limit="1000")
    key = new_key("acme")
    ttl = 30
    with web_processes(1, tmp_path, database_url=via(proxy)) as webs:
        web = webs[0]
        held = [
            httpx.post(
                f"{web.url}{BASE}reservations",
                json=reserve_body(ttl_seconds=ttl),
                headers=headers(key, f"h{n}"),
                timeout=60,
            )
            for n in range(5)
        ]
        assert [r.status_code for r in held] == [201] * 5
        committed = httpx.post(
            f"{web.url}{BASE}reservations/{held[0].json()['id']}/commit",
            json={"input_tokens": 0, "output_tokens": 100},
            headers=headers(key, "c0"),
            timeout=60,
        )
        assert committed.status_code == 200
        web.kill()
        TALLY["web SIGKILL holding reservations"] += 1
    assert Reservation.objects.filter(state=ReservationState.HELD).count() == 4
    assert budgets.sweep() == 0  # not before their TTL
    assert sweep_after_ttl(ttl) == 4
    assert not Reservation.objects.filter(state=ReservationState.HELD).exists()
    assert UsageRecord.objects.filter(reservation_id=held[0].json()["id"]).count() == 1
    invariants()


def post_until_stalled(
    url: str, body: dict[str, object], key: str, idem: str, stalled: threading.Event
) -> httpx.Response | None:
    """POST in a thread; the response, or None once the proxy holds one of its messages."""
    result: list[httpx.Response | BaseException] = []

    def send() -> None:
        try:
            result.append(httpx.post(url, json=body, headers=headers(key, idem), timeout=120))
        except BaseException as exc:  # the kill ends it
            result.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        thread.join(0.01)
        if not thread.is_alive():
            outcome = result[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        if stalled.is_set():
            return None
    raise AssertionError("the request neither finished nor stalled")


@pytest.mark.parametrize("path", ["reservations", "commit"])
def test_a_web_process_killed_inside_a_request_at_every_message(
    tmp_path: Path, proxy: FaultProxy, path: str
) -> None:
    """SIGKILL while the request waits on the database, at its 1st, 2nd, ... message: the
    transaction it had open is rolled back; whatever committed stays; the retry (same key, in
    the restarted process) answers once."""
    seed(limit="100000")
    key = new_key("acme")
    kills = 0
    with contextlib.ExitStack() as stack:
        web = stack.enter_context(web_processes(1, tmp_path, database_url=via(proxy)))[0]
        first = 1 if path == "reservations" or STRIDE == 1 else 2
        for nth in range(first, 80, STRIDE):
            hold_id = None
            body: dict[str, object] = reserve_body(ttl_seconds=30)
            suffix = "reservations"
            if path != "reservations":
                hold = httpx.post(
                    f"{web.url}{BASE}reservations",
                    json=body,
                    headers=headers(key, f"{path}-h{nth}"),
                    timeout=60,
                )
                assert hold.status_code == 201, hold.text
                hold_id = hold.json()["id"]
                suffix = f"reservations/{hold_id}/{path}"
                body = {"input_tokens": 0, "output_tokens": 10}
            idem = f"{path}-{nth}"
            stalled = proxy.stall_when_client_sends(b"", nth=nth)
            response = post_until_stalled(f"{web.url}{BASE}{suffix}", body, key, idem, stalled)
            if response is not None:  # every message went through: all points were tried
                proxy.heal()
                assert response.status_code in (200, 201), response.text
                break
            web.kill()
            kills += 1
            proxy.heal()
            invariants()
            web = stack.enter_context(web_processes(1, tmp_path, database_url=via(proxy)))[0]
            retry = httpx.post(
                f"{web.url}{BASE}{suffix}", json=body, headers=headers(key, idem), timeout=60
            )
            if retry.status_code == 409:  # the dead request's claim: its lease must pass
                lease_passes()
                retry = httpx.post(
                    f"{web.url}{BASE}{suffix}", json=body, headers=headers(key, idem), timeout=60
                )
            assert retry.status_code in (200, 201), retry.text
            if path == "reservations":
                assert Reservation.objects.filter(idempotency_key=idem).count() == 1
            if hold_id is not None:
                assert UsageRecord.objects.filter(reservation_id=hold_id).count() == 1
            invariants()
    assert kills >= 6 // STRIDE
    TALLY[f"web SIGKILL inside {path}"] += kills
    sweep_after_ttl(30)
    assert not Reservation.objects.filter(state=ReservationState.HELD).exists()
    invariants()


def _reserve_then_commit_in_child(ready: Any, go: Any, ttl: int) -> None:
    """A worker process (forked): takes two holds, then commits the first (which waits on the
    counter lock the parent holds), and is killed there."""
    for conn in connections.all(initialized_only=True):
        conn.connection = None  # never reuse the parent's socket
    first = reserve_30(ttl=ttl)
    reserve_30(ttl=ttl)
    ready.put(str(first.id))
    go.get(timeout=60)
    budgets.commit(first.id, input_tokens=0, output_tokens=10)  # blocks on the parent's lock
    ready.put("committed")  # never reached: killed while waiting inside the transaction


def test_a_worker_killed_inside_a_commit_leaves_its_holds_to_the_sweep() -> None:
    """SIGKILL of a Python-API worker inside commit's transaction (its write waiting on a
    counter lock). The commit's write and its COMMIT go to the server in one batch
    (``statements.run_committing``), so the server, which has the whole batch, finishes the
    commit once the lock is free: the usage the worker reported is charged, once. (Had the
    worker died before the batch reached the server, the transaction would roll back and the
    hold stay held for the sweep; both end settled, charged once.) The other hold stays held
    until its TTL and the sweep settles it."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    seed(limit="1000")
    ttl = 30
    context = multiprocessing.get_context("fork")
    ready, go = context.Queue(), context.Queue()
    connections.close_all()
    child = context.Process(target=_reserve_then_commit_in_child, args=(ready, go, ttl))
    with patient_lock_waits(60):  # forked with it: the child's commit waits, not refuses
        child.start()
    try:
        hold_id = ready.get(timeout=60)
        counter_ids = list(Counter.objects.values_list("pk", flat=True))
        assert counter_ids
        with RowLocker(counter_ids, timeout=120):
            go.put("commit")
            # Wait until the child's commit waits on our lock, inside its transaction.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _waiting_on_a_lock():
                time.sleep(0.05)
            assert _waiting_on_a_lock(), "the child never reached the counter lock"
            backend = _lock_waiter()
            os.kill(child.pid, 9)
            child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    TALLY["worker SIGKILL inside commit"] += 1
    # The lock is free: the server runs what it had. Wait (bounded) until the killed worker's
    # backend has ended (its transaction committed or rolled back), then read the outcome.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _backend_alive(backend):
        time.sleep(0.05)
    assert not _backend_alive(backend), "the killed worker's backend never ended"
    state = Reservation.objects.get(pk=hold_id).state
    assert state in (ReservationState.COMMITTED, ReservationState.HELD), state
    committed = state == ReservationState.COMMITTED
    TALLY[f"worker SIGKILL inside commit: {'committed' if committed else 'rolled back'}"] += 1
    assert UsageRecord.objects.count() == int(committed)
    invariants()
    assert sweep_after_ttl(ttl) == 2 - committed
    assert UsageRecord.objects.filter(reservation_id=hold_id).count() == 1  # charged once
    assert UsageRecord.objects.count() == 2
    invariants()


def _lock_waiter() -> int:
    """The process id of the one backend waiting on a lock in this database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        (pid,) = cursor.fetchall()
        return int(pid[0])


def _backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])
