"""What the one-line guard costs per call: the same OpenAI chat completion, unguarded and guarded,
against the tests' fake OpenAI on 127.0.0.1 (so the provider's own latency is a loopback round
trip and the guard's share is as large as it can be).

Usage (from the repository root)::

    python bench/guard.py [--calls 300] [--stream]
                          [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_bench]

The database named by ``--database-url`` is DROPPED and recreated, then migrated and seeded; its
name must contain ``bench``. Prints p50 and p99 latency per call for each path and the guard's
added median. Results: docs/integrations.md ("What the guard costs").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--stream", action="store_true", help="stream=True, read to the end")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/llm_budgets_bench"
    )
    args = parser.parse_args()
    if "bench" not in args.database_url:
        sys.exit("--database-url must name a database containing 'bench' (it is dropped).")
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    _recreate(args.database_url)
    connection.close()
    call_command("migrate", verbosity=0)

    import openai

    from llm_budgets import budgets
    from llm_budgets.integrations.openai import guard
    from llm_budgets.testing.fakes.openai_server import FakeOpenAI

    budgets.set_price(
        provider="openai", model="gpt-4o", input_per_mtok=Decimal("2.5"), output_per_mtok="10"
    )
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(1_000_000), window="month")
    fake = FakeOpenAI()
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-bench", max_retries=0)
    guarded = guard(sdk, tenant="acme", end_user="u-1")
    messages = [{"role": "user", "content": "Summarise this support ticket in one line, please."}]

    def call(client: object) -> None:
        result = client.chat.completions.create(  # type: ignore[attr-defined]
            model="gpt-4o", messages=messages, max_completion_tokens=200, stream=args.stream
        )
        if args.stream:
            for _chunk in result:
                pass

    timings: dict[str, list[float]] = {"unguarded": [], "guarded": []}
    for _ in range(20):  # warm-up: connections, tokenizer, prepared plans
        call(sdk)
        call(guarded)
    for _ in range(args.calls):
        for name, client in (("unguarded", sdk), ("guarded", guarded)):
            start = time.perf_counter()
            call(client)
            timings[name].append((time.perf_counter() - start) * 1000)
    fake.stop()
    print(f"{args.calls} calls each, stream={args.stream}, {connection.vendor}")
    for name, values in timings.items():
        values.sort()
        p99 = values[int(len(values) * 0.99) - 1]
        print(f"{name:10} p50 {statistics.median(values):6.2f} ms   p99 {p99:6.2f} ms")
    added = statistics.median(timings["guarded"]) - statistics.median(timings["unguarded"])
    print(f"the guard adds {added:.2f} ms at the median")


def _recreate(url: str) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    import psycopg

    name = connection.settings_dict["NAME"]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
