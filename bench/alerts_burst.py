"""A burst of alert events while admission runs: delivered, each once, without blocking admission.

Usage (from the repository root)::

    python bench/alerts_burst.py [--events 10000] [--cycles 200] [--rounds 3]
                                 [--database-url postgres://postgres@127.0.0.1:5432/lb_alerts_bench]

The database is DROPPED and recreated (its name must contain ``bench``), migrated and seeded
with a price and a tenant whose budget never runs out. An operators' webhook endpoint points at
a receiver on 127.0.0.1 that stores each delivery id it is sent.

1. Admission alone: ``--rounds`` rounds of ``--cycles`` reserve + commit cycles, one after
   another in this process (each timed).
2. The burst: ``--events`` ``hold.expired`` events written in one transaction (the sweep's
   batch path, ``alerts_emit_many``), each with its outbox row.
3. A second process, as a Celery worker would be, runs the receiver and ``alerts_deliver()``
   until nothing is pending, while this one keeps running admission cycles (timed), and then
   ``--rounds`` rounds of admission alone again, to bracket the machine's drift.

Prints admission's median and p95 per phase, how long the burst took to write and to deliver,
how many deliveries the receiver stored, how many distinct ids, and whether they came in order.
Results: docs/performance.md, "Alerts".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/lb_alerts_bench"
EVENT = "hold.expired"
TENANT = "burst"


def _recreate(url: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = str(conninfo_to_dict(url)["dbname"])
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: the bench database's name must say bench")
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def _setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    django.setup()
    # The receiver is on loopback, over plain http: allowed here explicitly, as in the tests.
    settings.LLM_BUDGETS = {
        **settings.LLM_BUDGETS,
        "ALERTS_ALLOW_HTTP": True,
        "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"],
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cycle() -> float:
    from llm_budgets import budgets

    started = time.perf_counter()
    hold = budgets.reserve(
        tenant=TENANT, provider="openai", model="gpt-4o", input_tokens=100, max_output_tokens=50
    )
    hold.commit(input_tokens=100, output_tokens=20)
    return (time.perf_counter() - started) * 1000


def _stats(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"{len(ordered):>6} {statistics.median(ordered):>10.2f} {p95:>8.2f}"


def _bodies(count: int) -> list[dict[str, Any]]:
    return [
        {
            "reservation_id": f"burst-{i}",
            "tenant": TENANT,
            "end_user": None,
            "model": "gpt-4o",
            "amount": "0.0010000000",
            "currency": "USD",
            "policy": "charge",
            "reserved_at": "2026-12-05T09:58:00+00:00",
            "expired_at": "2026-12-05T10:00:30+00:00",
        }
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=200, help="admission cycles per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--deliver", type=int, default=0, help=argparse.SUPPRESS)  # child: port
    args = parser.parse_args()
    if args.deliver:
        _deliverer(args.database_url, args.deliver)
        return
    _recreate(args.database_url)
    _setup(args.database_url)
    from django.core.management import call_command
    from django.db import transaction

    from llm_budgets import budgets
    from llm_budgets.alerts.emit import alerts_emit_many
    from llm_budgets.alerts.endpoints import endpoint_create
    from llm_budgets.models import AlertDelivery, EndpointKind, Tenant

    call_command("migrate", verbosity=0)
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
    )
    budgets.ensure_tenant(tenant=TENANT)
    budgets.set_limit(tenant=TENANT, amount=Decimal(10**9), window="month")
    tenant_id = Tenant.objects.get(external_id=TENANT).pk
    port = _free_port()
    endpoint_create(
        tenant=None,
        kind=EndpointKind.WEBHOOK,
        target=f"http://127.0.0.1:{port}/hook",
        event_types=[EVENT],
        actor="bench",
    )
    _cycle()  # warm-up
    before = [_cycle() for _ in range(args.rounds * args.cycles)]

    started = time.perf_counter()
    with transaction.atomic():
        written = alerts_emit_many(EVENT, [(tenant_id, body) for body in _bodies(args.events)])
    write_ms = (time.perf_counter() - started) * 1000
    assert written == args.events, (written, args.events)

    child = subprocess.Popen(
        [sys.executable, __file__, "--deliver", str(port), "--database-url", args.database_url],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    delivering_started = time.perf_counter()
    during = []
    while child.poll() is None:
        during.append(_cycle())
    deliver_s = time.perf_counter() - delivering_started
    report = json.loads(child.stdout.read())
    after = [_cycle() for _ in range(args.rounds * args.cycles)]

    pending = AlertDelivery.objects.filter(state="pending").count()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    print(f"burst: {args.events} events and their deliveries written in {write_ms:.0f} ms")
    print(
        f"delivered in {deliver_s:.1f} s ({args.events / deliver_s:.0f}/s): receiver stored "
        f"{report['stored']} deliveries, {report['distinct']} distinct ids, in order: "
        f"{report['in_order']}; pending after: {pending}"
    )
    print(f"{'admission (reserve + commit)':<30} {'cycles':>6} {'median ms':>10} {'p95 ms':>8}")
    print(f"{'alone, before the burst':<30} {_stats(before)}")
    print(f"{'while the burst is delivered':<30} {_stats(during)}")
    print(f"{'alone, after':<30} {_stats(after)}")
    if report["distinct"] != args.events or report["stored"] != args.events or pending:
        raise SystemExit("not every event was delivered exactly once")
    if not report["in_order"]:
        raise SystemExit("deliveries came out of order")


def _deliverer(url: str, port: int) -> None:
    """The second process: the receiver on ``port`` and the delivery job until nothing is due."""
    _setup(url)
    from llm_budgets.alerts.delivery import alerts_deliver
    from llm_budgets.models import AlertDelivery
    from llm_budgets.testing.fakes.server import serve_in_background

    seen: list[str] = []
    lock = threading.Lock()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                seen.append(self.headers.get("LLM-Budgets-Delivery", ""))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
    serve_in_background(server)
    print("ready", flush=True)
    while AlertDelivery.objects.filter(state="pending").exists():
        alerts_deliver()
    server.shutdown()
    order = list(
        AlertDelivery.objects.order_by("pk").values_list("uid", flat=True)
    )  # one endpoint: the outbox's order is the order owed
    print(
        json.dumps({"stored": len(seen), "distinct": len(set(seen)), "in_order": seen == order}),
        flush=True,
    )


if __name__ == "__main__":
    main()
