"""The REST API under load, end to end: gunicorn workers on PostgreSQL, client processes, and an
invariant checker sampling every counter while they run.

Usage (from the repository root)::

    python bench/load.py [--clients 8] [--workers 2] [--duration 20] [--port 8107] [--hot]
                         [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_bench]

The database is DROPPED and recreated (its name must contain ``bench``), migrated and seeded:
``--tenants`` tenants with API keys, each capped so that the busy ones reach their limit during
the run (refusals at the limit are part of the mix), under one global budget.

Phases:

1. **Overhead**: one client, no other load: reserve+commit in-process (``budgets.reserve`` and
   ``hold.commit``) against the same pair over HTTP through gunicorn; the difference of medians is
   the REST overhead per cycle.
2. **Load**: ``--clients`` processes, each looping over a mix for ``--duration`` seconds:
   reserve then commit (most), reserve then release, an idempotent retry of a reserve (same
   ``Idempotency-Key``: must answer the first reservation), a few abandoned holds (short TTL, left
   for the sweep). Meanwhile the checker process samples every counter with its recorded overage in
   one statement (one snapshot) and runs the sweep every two seconds.

At the end: conservation (``counters_drift``: each counter equals its ledger lines and live holds)
after a final sweep. Prints throughput, p50/p99 per endpoint, status counts (zero 5xx expected),
invariant samples and violations. Numbers and method: docs/performance.md. Not a CI test.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter as Tally
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_bench"
BASE = "/api/llm-budgets/v1/"
PROVIDER, MODEL = "openai", "gpt-4o"
INPUT_TOKENS, MAX_OUTPUT_TOKENS = 1200, 500  # worst case 0.008 USD at 2.50 / 10.00 per Mtok
RESERVE_BODY = {
    "provider": PROVIDER,
    "model": MODEL,
    "input_tokens": INPUT_TOKENS,
    "max_output_tokens": MAX_OUTPUT_TOKENS,
}


def _django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # not a line per sweep run
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _recreate(database_url: str) -> None:
    params = conninfo_to_dict(make_conninfo(database_url))
    name = str(params["dbname"])
    if "bench" not in name:
        raise SystemExit(
            f"refusing to drop {name!r}: the bench database's name must contain 'bench'"
        )
    with psycopg.connect(make_conninfo(database_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": database_url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)


def price_set() -> None:
    """The benches' one price: 2.50 input and 10.00 output per million tokens, since 2020."""
    from datetime import UTC, datetime

    from llm_budgets import budgets

    budgets.set_price(
        provider=PROVIDER,
        model=MODEL,
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC),
    )


def _seed(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Tenants with keys: (external id, key). Every fourth tenant has a small cap (six calls)."""
    from llm_budgets import budgets
    from llm_budgets.control.api_keys import api_key_create

    price_set()
    hot = True if args.hot else None  # hot caps (docs/design/hot-caps.md): striped counters
    budgets.set_limit(amount=Decimal("1000000"), window="month", hot=hot)  # global
    tenants = []
    for i in range(args.tenants):
        external = f"t{i:03d}"
        budgets.ensure_tenant(tenant=external, name=f"Tenant {i}")
        # A small cap on every fourth tenant: refusals at the limit.
        limit = Decimal("0.05") if i % 4 == 0 else Decimal("100000")
        budgets.set_limit(tenant=external, amount=limit, window="month", hot=hot)
        budgets.set_limit(tenant=external, end_user="*", amount=Decimal("50000"), window="month")
        _, key = api_key_create(tenant=external, name="load")
        tenants.append((external, key))
    return tenants


def _gunicorn(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_SETTINGS_MODULE": "load_settings",
        "PYTHONPATH": f"{ROOT / 'bench'}:{ROOT}",
    }
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi:application",
        "--workers",
        str(args.workers),
        "--bind",
        f"127.0.0.1:{args.port}",
        "--log-level",
        "warning",
        "--access-logfile",
        "-" if args.access_log else "/dev/null",
    ]
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{args.port}{BASE}health", timeout=2).status_code:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit("gunicorn did not answer within 30 s")


def _client(
    index: int, args: argparse.Namespace, tenants: list[tuple[str, str]], queue: Any
) -> None:
    """One client process: the mix, for the duration. Puts (endpoint, status, seconds) rows."""
    rng = random.Random(index)
    rows: list[tuple[str, int, float]] = []
    http = httpx.Client(base_url=f"http://127.0.0.1:{args.port}{BASE}", timeout=30)
    stop = time.monotonic() + args.duration

    def call(endpoint: str, method: str, path: str, key: str, **kw: Any) -> httpx.Response:
        started = time.perf_counter()
        response = http.request(method, path, headers={"Authorization": f"Api-Key {key}"}, **kw)
        rows.append((endpoint, response.status_code, time.perf_counter() - started))
        return response

    retries_ok = retries_bad = 0
    while time.monotonic() < stop:
        _tenant, key = rng.choice(tenants)
        body = {**RESERVE_BODY, "end_user": f"u{rng.randrange(args.end_users)}"}
        roll = rng.random()
        if roll < 0.02:  # abandoned: a short TTL, never settled; the sweep expires it
            call("reserve", "POST", "reservations", key, json={**body, "ttl_seconds": 2})
            continue
        idem = str(uuid.uuid4())
        first = call("reserve", "POST", "reservations", key, json=body)
        if first.status_code != 201:
            continue
        rid = first.json()["id"]
        if roll < 0.07:  # an idempotent retry of the same reserve
            again = call(
                "reserve (retry)",
                "POST",
                "reservations",
                key,
                json={**body, "idempotency_key": idem},
            )
            replay = call(
                "reserve (retry)",
                "POST",
                "reservations",
                key,
                json={**body, "idempotency_key": idem},
            )
            # A first attempt refused at the limit (429) is not a retry pair: nothing was held.
            if again.status_code == 201:
                same = (
                    replay.status_code in (200, 201) and replay.json()["id"] == again.json()["id"]
                )
                retries_ok, retries_bad = retries_ok + same, retries_bad + (not same)
            if again.status_code == 201:
                call(
                    "commit",
                    "POST",
                    f"reservations/{again.json()['id']}/commit",
                    key,
                    json={"input_tokens": INPUT_TOKENS, "output_tokens": 10},
                )
        if roll < 0.17:
            call("release", "POST", f"reservations/{rid}/release", key, json={})
        else:
            usage = {
                "input_tokens": INPUT_TOKENS,
                "output_tokens": rng.randrange(1, MAX_OUTPUT_TOKENS),
            }
            call("commit", "POST", f"reservations/{rid}/commit", key, json=usage)
    queue.put((index, rows, retries_ok, retries_bad))


def _checker(args: argparse.Namespace, stop: Any, queue: Any) -> None:
    """Samples every counter against its limit and recorded overage (one statement, one snapshot)
    until ``stop`` is set; sweeps every two seconds."""
    _django(args.database_url)
    from django.db import connection

    from llm_budgets import budgets
    from llm_budgets.models import Budget, Counter, ReservationHold, UsageRecord

    c, b = Counter._meta.db_table, Budget._meta.db_table
    h, u = ReservationHold._meta.db_table, UsageRecord._meta.db_table
    # One row per logical counter: a hot budget's stripes are summed (each stripe alone may sit
    # far below the limit while their sum is past it).
    query = (
        f'SELECT MIN(c.id), SUM(c.spent), SUM(c.reserved), b."limit", '
        f"COALESCE(SUM(o.overage), 0) FROM {c} c "
        f"JOIN {b} b ON b.id = c.budget_id LEFT JOIN (SELECT h.counter_id, SUM(u.overage) AS "
        f"overage FROM {h} h JOIN {u} u ON u.reservation_id = h.reservation_id "
        f"GROUP BY h.counter_id) o ON o.counter_id = c.id "
        f'GROUP BY c.budget_id, c.end_user_id, c.run_id, c.api_key_id, c.period_start, b."limit"'
    )
    samples = violations = sweeps = expired = 0
    examples: list[str] = []
    last_sweep = time.monotonic()
    while not stop.is_set():
        with connection.cursor() as cursor:
            cursor.execute(query)
            for cid, spent, reserved, limit, overage in cursor.fetchall():
                samples += 1
                if spent + reserved > limit + overage:
                    violations += 1
                    if len(examples) < 5:
                        examples.append(
                            f"counter {cid}: {spent} + {reserved} > {limit} + {overage}"
                        )
        if time.monotonic() - last_sweep > 2:
            expired += budgets.sweep()
            sweeps += 1
            last_sweep = time.monotonic()
        time.sleep(0.05)
    queue.put((samples, violations, examples, sweeps, expired))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _overhead(args: argparse.Namespace, tenant: tuple[str, str], rounds: int) -> dict[str, float]:
    from llm_budgets import budgets

    external, key = tenant
    http = httpx.Client(
        base_url=f"http://127.0.0.1:{args.port}{BASE}",
        headers={"Authorization": f"Api-Key {key}"},
        timeout=30,
    )
    inproc, over_http, reserve_http, commit_http = [], [], [], []
    for i in range(rounds + 5):
        started = time.perf_counter()
        hold = budgets.reserve(
            tenant=external,
            end_user="overhead",
            provider=PROVIDER,
            model=MODEL,
            input_tokens=INPUT_TOKENS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )
        hold.commit(input_tokens=INPUT_TOKENS, output_tokens=100)
        mid = time.perf_counter()
        r = http.post("reservations", json={**RESERVE_BODY, "end_user": "overhead"})
        assert r.status_code == 201, r.text
        between = time.perf_counter()
        c = http.post(
            f"reservations/{r.json()['id']}/commit",
            json={"input_tokens": INPUT_TOKENS, "output_tokens": 100},
        )
        assert c.status_code == 200, c.text
        end = time.perf_counter()
        if i >= 5:
            inproc.append(mid - started)
            over_http.append(end - mid)
            reserve_http.append(between - mid)
            commit_http.append(end - between)
    return {
        "in-process reserve+commit p50 ms": statistics.median(inproc) * 1000,
        "HTTP reserve+commit p50 ms": statistics.median(over_http) * 1000,
        "HTTP reserve p50 ms": statistics.median(reserve_http) * 1000,
        "HTTP commit p50 ms": statistics.median(commit_http) * 1000,
        "REST overhead per cycle (p50 difference) ms": (
            statistics.median(over_http) - statistics.median(inproc)
        )
        * 1000,
        "REST overhead per request ms": (statistics.median(over_http) - statistics.median(inproc))
        * 500,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--port", type=int, default=8107)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--end-users", type=int, default=50)
    parser.add_argument("--overhead-rounds", type=int, default=40)
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument(
        "--hot",
        action="store_true",
        help="mark the global and every tenant cap hot (the small caps then refuse at the limit "
        "through the exact path)",
    )
    args = parser.parse_args()

    _recreate(args.database_url)
    _django(args.database_url)
    tenants = _seed(args)
    from django.db import connections

    connections.close_all()
    print(f"load: {os.cpu_count()} cores, load average {os.getloadavg()} at start")
    server = _gunicorn(args)
    try:
        for name, value in _overhead(args, tenants[1], args.overhead_rounds).items():
            print(f"  {name:<45} {value:8.2f}")
        connections.close_all()

        context = multiprocessing.get_context("fork")
        queue, stop = context.Queue(), context.Event()
        checker = context.Process(target=_checker, args=(args, stop, queue))
        checker.start()
        clients = [
            context.Process(target=_client, args=(i, args, tenants, queue))
            for i in range(args.clients)
        ]
        started = time.perf_counter()
        for process in clients:
            process.start()
        results = [queue.get(timeout=args.duration + 120) for _ in clients]
        elapsed = time.perf_counter() - started
        stop.set()
        samples, violations, examples, sweeps, expired = queue.get(timeout=60)
        for process in [*clients, checker]:
            process.join(30)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)

    rows = [row for _, client_rows, _, _ in results for row in client_rows]
    retries_ok = sum(r[2] for r in results)
    retries_bad = sum(r[3] for r in results)
    statuses = Tally((endpoint, status) for endpoint, status, _ in rows)
    print(
        f"\nload: {args.clients} clients, {args.workers} gunicorn workers, {elapsed:.1f} s, "
        f"{len(rows)} requests, {len(rows) / elapsed:.0f} requests/s; "
        f"load average {os.getloadavg()} at end"
    )
    print(f"  {'endpoint':<16} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for endpoint in sorted({e for e, _, _ in rows}):
        times = [s for e, _, s in rows if e == endpoint]
        codes = ", ".join(
            f"{code}: {n}" for (e, code), n in sorted(statuses.items()) if e == endpoint
        )
        print(
            f"  {endpoint:<16} {len(times):>8} {_percentile(times, 0.5):>8.1f} "
            f"{_percentile(times, 0.99):>8.1f}  {codes}"
        )
    server_errors = sum(n for (_, code), n in statuses.items() if code >= 500)
    print(f"  5xx responses: {server_errors}")
    print(
        f"  idempotent retries answering the first reservation: {retries_ok} (else {retries_bad})"
    )
    print(
        f"  invariant: {samples} counter samples, {violations} with spent + reserved > limit + "
        f"overage {examples}; {sweeps} sweeps expired {expired} abandoned holds"
    )

    from llm_budgets import budgets
    from llm_budgets.jobs.reconcile import counters_drift

    time.sleep(2.5)  # the abandoned holds' 2 s TTL
    budgets.sweep()
    drift = counters_drift()
    print(f"  conservation after the final sweep: {len(drift)} drifting counters {drift[:3]}")
    if violations or drift or server_errors or retries_bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
