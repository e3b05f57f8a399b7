"""The ledger through a fault proxy (issue #17 item 1, and the statement-boundary crashes of item
3): a real web process talks to PostgreSQL through the fault proxy
(``llm_budgets/testing/faultproxy.py``); the test cuts its connection at every point of a request,
before and after the server saw each message, takes the database away and gives it back.

What must hold after every fault: the answer is a 503 with Retry-After (never a 500, never a
success that did not happen); nothing is half-written (conservation, no overspend, every
reservation in one state); a retry with the same Idempotency-Key finds the first result rather
than making a second hold; and the same web process serves again once the database is back.

Slow (about a minute): marked ``faults``, run by ``make test-faults``. PostgreSQL only (the proxy
sits on its TCP connection).
"""

from __future__ import annotations

import json
import time
from collections import Counter as Tally
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import IdempotencyRecord, Reservation, ReservationState
from llm_budgets.testing.faultproxy import FaultProxy
from tests.api import BASE, new_key, reserve_body
from tests.concurrency import overspent_counters
from tests.factories import seed
from tests.servers import WebProcess, web_processes
from tests.services import subprocess_database_url

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

# Faults applied, by kind, over this module's run: written to var/faults-tally-db.json at the end
# for docs/reliability.md.
TALLY: Tally[str] = Tally()


@pytest.fixture(autouse=True, scope="module")
def _write_tally() -> Iterator[None]:
    yield
    out = Path(__file__).resolve().parent.parent / "var" / "faults-tally-db.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(sorted(TALLY.items())), indent=2))


def via(proxy: FaultProxy) -> str:
    parts = urlsplit(subprocess_database_url())
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc, query="connect_timeout=3"))


@pytest.fixture
def proxied_web(tmp_path: Path) -> Iterator[tuple[FaultProxy, WebProcess, str]]:
    if connection.vendor != "postgresql":
        pytest.skip("the fault proxy sits on PostgreSQL's TCP connection")
    seed(limit="1000")
    key = new_key("acme")
    db = connection.settings_dict
    with FaultProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as proxy:
        with web_processes(1, tmp_path, database_url=via(proxy)) as webs:
            yield proxy, webs[0], key
        TALLY.update(proxy.counts)


def post(web: WebProcess, key: str, path: str, body: dict[str, Any], idem: str) -> httpx.Response:
    return httpx.post(
        f"{web.url}{BASE}{path}",
        json=body,
        headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": idem},
        timeout=60,
    )


def invariants() -> None:
    """Nothing half-written: conservation, no overspend, every reservation in one known state."""
    assert counters_drift() == []
    assert overspent_counters() == []
    assert set(Reservation.objects.values_list("state", flat=True)) <= set(ReservationState.values)


def lease_passes() -> None:
    """A request that died holds its Idempotency-Key for the lease (60 s): age the claims, as
    waiting would, instead of sleeping."""
    IdempotencyRecord.objects.filter(status_code__isnull=True).update(
        created_at=timezone.now() - timedelta(minutes=5)
    )


def retry_until_answered(
    web: WebProcess, key: str, path: str, body: dict[str, Any], idem: str
) -> httpx.Response:
    """The client's retry: a 409 idempotency_in_progress is the dead request's claim."""
    response = post(web, key, path, body, idem)
    if (
        response.status_code == 409
        and response.json()["error"]["code"] == "idempotency_in_progress"
    ):
        assert response.headers["Retry-After"]
        lease_passes()
        response = post(web, key, path, body, idem)
    return response


def assert_fails_closed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "ledger_unavailable"


def cut_every_chunk(
    proxy: FaultProxy, web: WebProcess, key: str, path: str, body: dict[str, Any], *, before: bool
) -> int:
    """Cut the request's connection at its 1st, 2nd, ... message to the database, until a request
    goes through untouched. After each cut: fail closed, invariants, a retry finds one result."""
    for nth in range(1, 200):
        cuts = nth - 1
        idem = f"cut-{path}-{before}-{nth}"
        fired = proxy.cut_when_client_sends(b"", before=before, nth=nth)
        response = post(web, key, path, body, idem)
        proxy.heal()
        if not fired.is_set():
            assert response.status_code in (200, 201), response.text
            return cuts
        if response.status_code not in (200, 201):
            # The server may have answered before the cut lost the reply: a success is fine too.
            assert_fails_closed(response)
        invariants()
        again = retry_until_answered(web, key, path, body, idem)
        assert again.status_code in (200, 201), (nth, again.text)
        if path == "reservations":
            assert Reservation.objects.filter(idempotency_key=idem).count() == 1
            release = post(web, key, f"reservations/{again.json()['id']}/release", {}, f"r-{idem}")
            assert release.status_code == 200, release.text
        invariants()
    raise AssertionError("the request never went through untouched")


@pytest.mark.parametrize("before", [True, False], ids=["before-server-saw-it", "after"])
def test_a_reservation_cut_at_every_message(proxied_web: Any, before: bool) -> None:
    proxy, web, key = proxied_web
    cuts = cut_every_chunk(proxy, web, key, "reservations", reserve_body(), before=before)
    assert cuts >= 3
    TALLY[f"reserve cut {'before' if before else 'after'}"] += cuts


@pytest.mark.parametrize("before", [True, False], ids=["before-server-saw-it", "after"])
@pytest.mark.parametrize("action", ["commit", "release"])
def test_commit_and_release_cut_at_every_message(
    proxied_web: Any, before: bool, action: str
) -> None:
    proxy, web, key = proxied_web
    body = {"input_tokens": 0, "output_tokens": 10} if action == "commit" else {}
    cuts = 0
    for nth in range(1, 200):
        hold = post(web, key, "reservations", reserve_body(), f"hold-{action}-{before}-{nth}")
        assert hold.status_code == 201, hold.text
        path = f"reservations/{hold.json()['id']}/{action}"
        idem = f"{action}-{before}-{nth}"
        fired = proxy.cut_when_client_sends(b"", before=before, nth=nth)
        response = post(web, key, path, body, idem)
        proxy.heal()
        if not fired.is_set():
            assert response.status_code == 200, response.text
            break
        cuts += 1
        if response.status_code != 200:
            assert_fails_closed(response)
        invariants()
        again = retry_until_answered(web, key, path, body, idem)
        assert again.status_code == 200, (nth, again.text)
        expected = ReservationState.COMMITTED if action == "commit" else ReservationState.RELEASED
        assert Reservation.objects.get(pk=hold.json()["id"]).state == expected
        invariants()
    assert cuts >= 3
    TALLY[f"{action} cut {'before' if before else 'after'}"] += cuts


def test_an_outage_fails_closed_and_heals_without_a_restart(proxied_web: Any) -> None:
    proxy, web, key = proxied_web
    assert post(web, key, "reservations", reserve_body(), "warm").status_code == 201
    pid = web.process.pid
    for fault in ("refuse", "reset", "blackhole"):
        getattr(proxy, fault)()
        if fault != "reset":
            proxy.reset()  # the open connection goes too: the next request must reconnect
        for attempt in range(3):
            started = time.monotonic()
            response = post(web, key, "reservations", reserve_body(), f"{fault}-{attempt}")
            elapsed = time.monotonic() - started
            if fault == "reset" and response.status_code == 201:
                continue  # a reset is over at once: the reconnect may already succeed
            assert_fails_closed(response)
            # Bounded: refused at once, or by connect_timeout (3 s) for a black hole.
            assert elapsed < 15, (fault, elapsed)
            TALLY[f"outage ({fault}) request"] += 1
        proxy.heal()
        response = retry_until_answered(web, key, "reservations", reserve_body(), f"{fault}-0")
        assert response.status_code == 201, response.text
        assert web.process.poll() is None
        assert web.process.pid == pid
        invariants()


def test_latency_slows_but_changes_nothing(proxied_web: Any) -> None:
    proxy, web, key = proxied_web
    proxy.latency_set(0.02)
    ids = []
    for n in range(5):
        response = post(web, key, "reservations", reserve_body(), f"slow-{n}")
        assert response.status_code == 201
        ids.append(response.json()["id"])
        commit = post(
            web,
            key,
            f"reservations/{ids[-1]}/commit",
            {"input_tokens": 0, "output_tokens": 1},
            f"slow-commit-{n}",
        )
        assert commit.status_code == 200
    proxy.heal()
    invariants()
    TALLY["latency requests"] += 10
