"""What the Stripe outbox costs settlement, on PostgreSQL.

Usage (from the repository root)::

    python bench/stripe_outbox.py [--cycles 400] [--rounds 5]
                                  [--database-url postgres://postgres@127.0.0.1:5432/lb_stripe_bench]

The database is DROPPED and recreated (its name must contain ``bench``), migrated and seeded.
One process commits reservations sequentially (reserve first, outside the timing), the three
variants interleaved commit by commit in random order, so machine load hits them alike:

- ``none``: the outbox statement removed from the commit (the cost before billing existed);
- ``unlinked``: a tenant with no Stripe link (the cached set of linked tenants says so: no
  statement);
- ``linked``: a linked tenant (the statement inserts the outbox row).

Prints, per variant, the median commit latency over all rounds, its p90, and the statements and
round trips of one commit (from Django's query log; on psycopg 3 with pipelining, the commit's
writes are one statement). Results: docs/performance.md, "Stripe outbox".
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/lb_stripe_bench"
VARIANTS = ("none", "unlinked", "linked")


def _recreate(url: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(url)
    name = str(info["dbname"])
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: the bench database's name must say bench")
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=400, help="commits per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args()
    _recreate(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from llm_budgets import budgets
    from llm_budgets.billing import outbox
    from llm_budgets.db import statements as sql
    from llm_budgets.models import BillingLine

    call_command("migrate", verbosity=0)
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
        effective_from=django.utils.timezone.now().replace(year=2020),
    )
    for tenant in VARIANTS:
        budgets.ensure_tenant(tenant=tenant)
        budgets.set_limit(tenant=tenant, amount=Decimal(10**9), window="month")
    budgets.link_stripe_customer(tenant="linked", customer_id="cus_bench")

    real_statements = outbox.settlement_statements

    def without_outbox(*a: Any, **k: Any) -> list[sql.Statement]:
        return []

    def use(variant: str) -> None:
        chosen = without_outbox if variant == "none" else real_statements
        outbox.settlement_statements = chosen  # type: ignore[assignment]

    def commit_once(variant: str, queries: list[str] | None = None) -> float:
        hold = budgets.reserve(
            tenant=variant, model="gpt-4o", provider="openai", input_tokens=1200,
            max_output_tokens=500,
        )  # fmt: skip
        started = time.perf_counter()
        if queries is None:
            hold.commit(input_tokens=1100, output_tokens=320)
            return time.perf_counter() - started
        with CaptureQueriesContext(connection) as captured:
            hold.commit(input_tokens=1100, output_tokens=320)
        queries.extend(q["sql"] for q in captured.captured_queries)
        return 0.0

    timings: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for variant in VARIANTS:  # warm-up: connections, prepared plans
        use(variant)
        for _ in range(20):
            commit_once(variant)
    order = list(VARIANTS)
    for _ in range(args.rounds):
        for _ in range(args.cycles):
            random.shuffle(order)  # interleaved commit by commit: load hits each alike
            for variant in order:
                use(variant)
                timings[variant].append(commit_once(variant))
    shape: dict[str, tuple[int, str]] = {}
    for variant in VARIANTS:
        use(variant)
        commits: list[str] = []
        commit_once(variant, commits)
        outboxed = any("billingline" in q for q in commits)
        shape[variant] = (len(commits), "with the outbox insert" if outboxed else "")
    use("linked")
    rows = BillingLine.objects.filter(tenant__external_id="linked").count()
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'variant':<10} {'median ms':>10} {'p90 ms':>8} {'statements/commit':>18}")
    base = statistics.median(timings["none"])
    for variant in VARIANTS:
        values = sorted(timings[variant])
        median = statistics.median(values)
        p90 = values[int(len(values) * 0.9)]
        print(
            f"{variant:<10} {median * 1000:>10.3f} {p90 * 1000:>8.3f} {shape[variant][0]:>18}"
            f"   {median / base:.3f}x  {shape[variant][1]}"
        )
    print(f"outbox rows written for the linked tenant: {rows}")


run: Callable[[], None] = main

if __name__ == "__main__":
    main()
