"""A real database crash (issue #17 item 2): a throwaway PostgreSQL cluster of its own (initdb
into a temporary directory, its own port), under load from two web processes, killed with SIGKILL
(postmaster and every backend at once) and started again, so it runs crash recovery.

What must hold: every reservation and commit the API acknowledged is there after recovery;
nothing half-written (the reconcile command finds no drift: conservation); no admission overspent;
the sweep settles the holds left behind. During the outage, every request failed closed (503)
or was never answered; none was a 500.

Marked ``faults`` (``make test-faults``). Needs PostgreSQL's server binaries (initdb, postgres),
which the CI machine has with its PostgreSQL; run as root, the cluster runs as ``postgres``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api import BASE
from tests.servers import ROOT, web_processes
from tests.services import free_port, require

pytestmark = pytest.mark.faults

SEED = """
import django; django.setup()
from tests.factories import seed
from tests.api import new_key
seed(limit="100000")
print(new_key("acme"))
"""
CHECK = """
import json, django; django.setup()
from datetime import timedelta
from django.utils import timezone
from llm_budgets import budgets
from llm_budgets.models import Reservation, UsageRecord
from llm_budgets.jobs.reconcile import counters_drift
from tests.concurrency import overspent_counters
before = {"drift": [str(d) for d in counters_drift()], "overspent": overspent_counters()}
swept = budgets.sweep(now=timezone.now() + timedelta(seconds=120))
print(json.dumps({
    **before,
    "swept": swept,
    "held_after_sweep": Reservation.objects.filter(state="held").count(),
    "drift_after_sweep": [str(d) for d in counters_drift()],
    "states": {str(r.pk): r.state for r in Reservation.objects.all()},
    "charged": {str(u.reservation_id): 1 for u in UsageRecord.objects.all()},
    "lines_per_reservation": max(
        [n for n in __import__("collections").Counter(
            UsageRecord.objects.values_list("reservation_id", flat=True)).values()] or [0]),
}))
"""


def binaries() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        require(
            "PostgreSQL server binaries (initdb)", lambda: (_ for _ in ()).throw(OSError("none"))
        )
    return found[-1].parent


class Cluster:
    def __init__(self, bindir: Path, datadir: Path, port: int) -> None:
        self.bindir = bindir
        self.datadir = datadir
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"postgres://postgres@127.0.0.1:{port}/crash?connect_timeout=3"
        self.user = "postgres" if os.geteuid() == 0 else None

    def start(self) -> None:
        log = (self.datadir.parent / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-k",
                str(self.datadir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=50",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError("the throwaway cluster did not start")

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend at once (its own process group)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the kernel has ended every backend too
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise AssertionError("backends of the killed cluster are still running")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)


@contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    bindir = binaries()
    root = Path(tempfile.mkdtemp(prefix="llmb-crash-"))
    datadir = root / "data"
    datadir.mkdir()
    user = "postgres" if os.geteuid() == 0 else None
    if user:
        shutil.chown(root, user)
        shutil.chown(datadir, user)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(datadir),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
        user=user,
    )
    cluster = Cluster(bindir, datadir, free_port())
    cluster.start()
    try:
        subprocess.run(
            [
                str(bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(cluster.port),
                "-U",
                "postgres",
                "crash",
            ],
            check=True,
            capture_output=True,
        )
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def manage(url: str, *args: str, code: str | None = None) -> str:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.server_settings"}
    command = [sys.executable, "-c", code] if code else [sys.executable, "manage.py", *args]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_database_crash_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with throwaway_cluster() as cluster:
        manage(cluster.url, "migrate", "--noinput")
        key = manage(cluster.url, code=SEED).strip().splitlines()[-1]
        acknowledged: dict[str, str] = {}  # reservation id -> state the API said
        statuses: list[int] = []
        lock = threading.Lock()
        stop = threading.Event()

        def client(web_url: str, worker: int) -> None:
            auth = {"Authorization": f"Api-Key {key}"}
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    made = httpx.post(
                        f"{web_url}{BASE}reservations",
                        json={
                            "provider": "fake",
                            "model": "m30",
                            "input_tokens": 0,
                            "max_output_tokens": 1000,
                            "ttl_seconds": 60,
                        },
                        headers={**auth, "Idempotency-Key": f"w{worker}-{n}"},
                        timeout=30,
                    )
                    with lock:
                        statuses.append(made.status_code)
                    if made.status_code != 201:
                        continue
                    rid = made.json()["id"]
                    with lock:
                        acknowledged[rid] = "held"
                    action = "commit" if n % 2 else "release"
                    body = {"input_tokens": 0, "output_tokens": 500} if action == "commit" else {}
                    done = httpx.post(
                        f"{web_url}{BASE}reservations/{rid}/{action}",
                        json=body,
                        headers=auth,
                        timeout=30,
                    )
                    with lock:
                        statuses.append(done.status_code)
                        if done.status_code == 200:
                            acknowledged[rid] = "committed" if action == "commit" else "released"
                except httpx.TransportError:
                    with lock:
                        statuses.append(0)  # no answer (the web process waited on the dead DB)

        with web_processes(2, tmp_path, database_url=cluster.url) as webs:
            threads = [
                threading.Thread(target=client, args=(webs[i % 2].url, i), daemon=True)
                for i in range(4)
            ]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 120
            while len(acknowledged) < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.crash()
            crashed_at = len(statuses)
            while len(statuses) < crashed_at + 8 and time.monotonic() < deadline:
                time.sleep(0.05)  # requests during the outage
            cluster.start()  # crash recovery
            recovered_at = len(statuses)
            while len(statuses) < recovered_at + 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            for thread in threads:
                thread.join(60)
        assert 500 not in statuses, statuses
        assert 503 in statuses[crashed_at:recovered_at] or 0 in statuses[crashed_at:recovered_at]
        assert statuses[-5:].count(201) + statuses[-5:].count(200) >= 3, statuses[-20:]
        result: dict[str, Any] = json.loads(
            manage(cluster.url, code=CHECK).strip().splitlines()[-1]
        )
    assert result["drift"] == []
    assert result["overspent"] == []
    assert result["drift_after_sweep"] == []
    assert result["held_after_sweep"] == 0
    assert result["lines_per_reservation"] <= 1  # nothing charged twice
    for rid, state in acknowledged.items():
        assert rid in result["states"], f"acknowledged reservation {rid} lost"
        if state != "held":
            assert result["states"][rid] == state, (rid, state, result["states"][rid])
    out = ROOT / "var" / "faults-tally-dbcrash.json"
    out.write_text(
        json.dumps(
            {
                "database SIGKILL under load": 1,
                "acknowledged reservations checked": len(acknowledged),
                "requests": len(statuses),
                "requests during outage": recovered_at - crashed_at,
                "swept after recovery": result["swept"],
            },
            indent=2,
        )
    )
