"""Scale curves: does admission stay flat as the ledger and the end users grow, and how long does a
sweep of many overdue holds take, with admissions running beside it?

Usage (from the repository root)::

    python bench/scale.py [--ledger 1000,100000,1000000] [--users 100,100000] [--holds 10000]
                          [--batch-size 2000]
                          [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_scale_bench]

The database is DROPPED and recreated (its name must contain ``bench``). Rows are bulk-copied in
SQL from a template row made by the services (ledger lines without a reservation or counter, so
they weigh on the tables and indexes but not on any counter; end users; held reservations with
their holds, the counters' ``reserved`` raised to match), then admission is timed in-process:
``--cycles`` reserve+commit pairs for one end user, median and p99. Numbers: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from load import (  # noqa: E402
    INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MODEL,
    PROVIDER,
    _django,
    _recreate,
    price_set,
)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_scale_bench"


def _columns(table: str, *, exclude: tuple[str, ...]) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position",
            [table],
        )
        return [row[0] for row in cursor.fetchall() if row[0] not in exclude]


def _copy_with(
    table: str, template_id: object, *, key: str, count: int, overrides: dict[str, str]
) -> None:
    """Insert ``count`` copies of row ``template_id`` of ``table``, one per row of the temporary
    table ``copies`` (``c.id``: a fresh UUID, ``c.n``: 1..count), with SQL ``overrides``."""
    from django.db import connection

    columns = [c for c in _columns(table, exclude=()) if c != "id" or "id" in overrides]
    names = ", ".join(f'"{c}"' for c in columns)
    picks = ", ".join(overrides.get(c, f't."{c}"') for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" ({names}) SELECT {picks} FROM "{table}" t, '
            f"(SELECT * FROM copies LIMIT %s) c WHERE t.{key} = %s",
            [count, template_id],
        )


def _copies(count: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS copies")
        cursor.execute(
            "CREATE TEMP TABLE copies AS SELECT gen_random_uuid() AS id, n "
            "FROM generate_series(1, %s) n",
            [count],
        )


def _cycles(count: int, *, end_user: str = "u0") -> list[float]:
    from llm_budgets import budgets

    times = []
    for _ in range(count + 5):
        started = time.perf_counter()
        hold = budgets.reserve(
            tenant="t0",
            end_user=end_user,
            provider=PROVIDER,
            model=MODEL,
            input_tokens=INPUT_TOKENS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )
        hold.commit(input_tokens=INPUT_TOKENS, output_tokens=100)
        times.append(time.perf_counter() - started)
    return times[5:]


def _cpu_per_cycle(count: int) -> tuple[float, float]:
    """(database backend CPU, client CPU) per reserve+commit cycle, in ms: the backend's
    utime+stime from /proc (PostgreSQL on this machine), the client's process_time."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    tick = os.sysconf("SC_CLK_TCK")

    def backend() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    db_before, client_before = backend(), time.process_time()
    _cycles(count)
    db = (backend() - db_before) / (count + 5) * 1000
    return db, (time.process_time() - client_before) / (count + 5) * 1000


def _report(label: str, times: list[float]) -> None:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(
        f"  {label:<42} p50 {statistics.median(times) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"
        f"   load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--ledger", default="1000,100000,1000000")
    parser.add_argument("--users", default="100,100000")
    parser.add_argument("--holds", type=int, default=10000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=2000, help="the sweep's batch size")
    args = parser.parse_args()

    _recreate(args.database_url)
    _django(args.database_url)
    from decimal import Decimal

    from django.db import connection
    from django.utils import timezone

    from llm_budgets import budgets
    from llm_budgets.engine.admission import reservation_create
    from llm_budgets.models import Counter, EndUser, Reservation, ReservationHold, UsageRecord

    price_set()
    budgets.set_limit(amount=Decimal("100000000"), window="month")
    budgets.ensure_tenant(tenant="t0", name="T0")
    budgets.set_limit(tenant="t0", amount=Decimal("100000000"), window="month")
    budgets.set_limit(tenant="t0", end_user="*", amount=Decimal("100000000"), window="month")
    _cycles(5)
    print(f"scale: {os.cpu_count()} cores, load average {os.getloadavg()} at start")
    db_ms, client_ms = _cpu_per_cycle(args.cycles * 3)
    print(f"  CPU per reserve+commit cycle: database {db_ms:.2f} ms, client {client_ms:.2f} ms")

    ledger, reservations = UsageRecord._meta.db_table, Reservation._meta.db_table
    line = UsageRecord.objects.filter(kind="charge").order_by("pk").first()
    assert line is not None
    have = UsageRecord.objects.count()
    for target in [int(n) for n in args.ledger.split(",")]:
        if target > have:
            # Committed reservations (without holds: they weigh on the tables, not on counters),
            # each with its charge line.
            started = time.perf_counter()
            _copies(target - have)
            _copy_with(
                reservations,
                line.reservation_id,
                key="id",
                count=target - have,
                overrides={"id": "c.id", "idempotency_key": "NULL"},
            )
            _copy_with(
                ledger,
                line.pk,
                key="id",
                count=target - have,
                overrides={"reservation_id": "c.id", "voids_id": "NULL"},
            )
            with connection.cursor() as cursor:
                cursor.execute(f'ANALYZE "{ledger}"')
                cursor.execute(f'ANALYZE "{reservations}"')
            have = target
            print(f"  ({target} ledger lines written in {time.perf_counter() - started:.0f} s)")
        _report(f"admission, {have:>9} ledger lines", _cycles(args.cycles))

    users = EndUser._meta.db_table
    template_user = EndUser.objects.get(external_id="u0")
    count = EndUser.objects.count()
    for target in [int(n) for n in args.users.split(",")]:
        if target > count:
            _copies(target - count)
            _copy_with(
                users,
                template_user.pk,
                key="id",
                count=target - count,
                overrides={"external_id": f"'bulk-' || (c.n + {count})", "created_at": "now()"},
            )
            with connection.cursor() as cursor:
                cursor.execute(f'ANALYZE "{users}"')
            count = target
        _report(f"admission, {count:>9} end users", _cycles(args.cycles))

    # Overdue holds: a template made by admission an hour ago, copied, counters raised to match.
    hour_ago = timezone.now() - timedelta(hours=1)
    first = reservation_create(
        tenant="t0",
        end_user="sweep",
        provider=PROVIDER,
        model=MODEL,
        input_tokens=INPUT_TOKENS,
        max_output_tokens=MAX_OUTPUT_TOKENS,
        ttl=60,
        now=hour_ago,
    )
    extra = args.holds - 1
    with connection.cursor() as cursor:
        _copies(extra)
        res, hold = Reservation._meta.db_table, ReservationHold._meta.db_table
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND column_name <> 'id' ORDER BY ordinal_position",
            [res],
        )
        cols = [r[0] for r in cursor.fetchall()]
        names = ", ".join(f'"{c}"' for c in cols)
        picks = ", ".join(f't."{c}"' for c in cols)
        cursor.execute(
            f'INSERT INTO "{res}" (id, {names}) SELECT c.id, {picks} FROM "{res}" t, copies c '
            "WHERE t.id = %s",
            [first.pk],
        )
        cursor.execute(
            f'INSERT INTO "{hold}" (reservation_id, counter_id, unit) SELECT c.id, h.counter_id, '
            f'h.unit FROM "{hold}" h, copies c WHERE h.reservation_id = %s',
            [first.pk],
        )
        for counter in Counter.objects.filter(holds__reservation=first):
            Counter.objects.filter(pk=counter.pk).update(
                reserved=counter.reserved + first.amount * extra
            )
    print(f"  {args.holds} overdue holds in place")

    # Admissions for another end user, in a thread, while the sweep runs: the longest one says how
    # long the sweep kept them waiting.
    done = threading.Event()
    beside: list[float] = []

    def admit() -> None:
        from django.db import connections

        try:
            while not done.is_set():
                beside.extend(_cycles(1, end_user="beside"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=admit)
    thread.start()
    started = time.perf_counter()
    expired = budgets.sweep(batch_size=args.batch_size)
    seconds = time.perf_counter() - started
    done.set()
    thread.join(60)
    print(
        f"  sweep: {expired} holds expired in {seconds:.1f} s "
        f"({seconds / max(expired, 1) * 1000:.2f} ms each, batches of {args.batch_size}, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    _report("admissions beside the sweep", beside)
    print(
        f"  longest admission beside the sweep: {max(beside) * 1000:.1f} ms ({len(beside)} cycles)"
    )
    from llm_budgets.jobs.reconcile import counters_drift

    print(f"  conservation after the sweep: {len(counters_drift())} drifting counters")


if __name__ == "__main__":
    main()
