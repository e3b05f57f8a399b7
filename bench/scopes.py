"""What naming a run and a tag costs a call (issue #16, item 4), on PostgreSQL.

Usage (from the repository root)::

    python bench/scopes.py [--cycles 1000] [--workers 1,8]
                           [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_bench]

The database is DROPPED and recreated (its name must contain ``bench``), as for
``bench/admission.py``. One tenant, one known end user, under global, tenant and each-end-user
month budgets; the tenant also has an each-run lifetime budget and a budget for the tag
``project=alpha``. Limits never refuse. Four kinds of call, each a reserve then a commit:

- ``plain``: names no run and no tag (the cost target: unchanged),
- ``tag``: ``tags={"project": "alpha"}``,
- ``run``: ``run=...`` (one run per worker, seen before),
- ``run+tag``: both.

For each kind it counts, on one call, the statements reserve sends, the round trips they take
and the counter rows it holds (one per budget that applies), then runs ``--cycles`` cycles per
worker in forked worker processes and prints cycles/s and p50/p99 latency.
Numbers: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission import DEFAULT_URL, recreate_database, setup_django, vacuum

KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "tag": {"tags": {"project": "alpha"}},
    "run": {"run": "run-{worker}"},
    "run+tag": {"run": "run-{worker}", "tags": {"project": "alpha"}},
}


def _call(kind: str, worker: int) -> Any:
    from llm_budgets import budgets

    scopes = {
        k: (v.format(worker=worker) if isinstance(v, str) else v) for k, v in KINDS[kind].items()
    }
    hold = budgets.reserve(
        tenant="acme",
        end_user="u-1",
        provider="openai",
        model="gpt-4o",
        input_tokens=1000,
        max_output_tokens=500,
        **scopes,
    )
    hold.commit(input_tokens=900, output_tokens=200)
    return hold


def seed() -> None:
    from llm_budgets import budgets

    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
    )
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(amount=Decimal("1000000000"), window="month")
    budgets.set_limit(tenant="acme", amount=Decimal("1000000000"), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("1000000000"), window="month")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("1000000000"), window="lifetime")
    budgets.set_limit(
        tenant="acme", tag=("project", "alpha"), amount=Decimal("1000000000"), window="month"
    )


def statements_and_rows(kind: str) -> tuple[int, int, int]:
    """Statements one reserve sends and the round trips they take (savepoints and BEGIN/COMMIT
    aside; statements psycopg pipelines together are one round trip), and rows it holds."""
    from llm_budgets import budgets
    from llm_budgets.testing.queries import round_trips

    _call(kind, 0)  # the run, end user and counters exist
    scopes = {k: (v.format(worker=0) if isinstance(v, str) else v) for k, v in KINDS[kind].items()}
    with round_trips() as trips:
        hold = budgets.reserve(
            tenant="acme",
            end_user="u-1",
            provider="openai",
            model="gpt-4o",
            input_tokens=1000,
            max_output_tokens=500,
            **scopes,
        )
    hold.release()
    # The lock-wait bound (a set_config) rides with the first locking statement: counted in
    # its round trip, not as a statement of its own.
    statements = [sql for trip in trips for sql in trip if not sql.startswith("SELECT set_config")]
    return len(statements), len(trips), hold.reservation.holds.count()


def _worker(kind: str, worker: int, cycles: int, barrier: Any, out: Any) -> None:
    from django.db import connections

    connections.close_all()  # a fresh connection per forked process
    for _ in range(20):
        _call(kind, worker)
    barrier.wait()
    latencies = []
    for _ in range(cycles):
        start = time.perf_counter()
        _call(kind, worker)
        latencies.append(time.perf_counter() - start)
    out.put(latencies)


def run_cell(kind: str, workers: int, cycles: int) -> tuple[float, float, float]:
    from django.db import connections

    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(kind, w, cycles, barrier, out)) for w in range(workers)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    latencies = [x for _ in procs for x in out.get(timeout=600)]
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return len(latencies) / elapsed, statistics.median(latencies) * 1000, p99 * 1000


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1000, help="cycles per worker")
    parser.add_argument("--workers", default="1,8", help="comma-separated worker counts")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    recreate_database(args.database_url)
    setup_django(args.database_url, 5)
    seed()
    print(f"{'kind':<8} {'statements':>10} {'round trips':>11} {'rows held':>9}")
    for kind in KINDS:
        count, trips, rows = statements_and_rows(kind)
        print(f"{kind:<8} {count:>10} {trips:>11} {rows:>9}")
    print(f"\n{'kind':<8} {'workers':>7} {'cycles/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for workers in [int(w) for w in args.workers.split(",")]:
        for kind in KINDS:
            vacuum(args.database_url)
            rate, p50, p99 = run_cell(kind, workers, args.cycles)
            print(f"{kind:<8} {workers:>7} {rate:>9.0f} {p50:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    main()
