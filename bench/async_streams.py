"""Async views' load in one worker: 1,000 concurrent streamed guarded calls on one event loop,
and admission through the async twins next to the sync path.

Usage (from the repository root)::

    python bench/async_streams.py [--streams 1000] [--chunks 20] [--chunk-delay 0.02]
                                  [--admissions 1000]
                                  [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_async_bench]

Against the fake OpenAI of ``llm_budgets.testing.fakes`` on 127.0.0.1 (its listen backlog raised
to take every stream at once), an ``openai.AsyncOpenAI`` guarded by
``llm_budgets.integrations.openai.guard`` streams ``--streams`` chat completions at once, each
``--chunks`` chunks ``--chunk-delay`` seconds apart, while a ticker task measures the event
loop's lag (how late a 5 ms sleep wakes up: the time the loop spent on something else). Then
``--admissions`` holds are taken and released: one after another through ``budgets.reserve``
(the sync path, one thread), and all at once through ``await budgets.areserve`` (one loop; outside
a request, asgiref runs every thread-sensitive call on one shared thread, so the database sees
them one at a time too). Prints the worst and p99 loop lag, the streams' wall time, and both
admission rates. The database named by ``--database-url`` is DROPPED and recreated; its name
must contain ``bench``. Results: docs/performance.md ("Async views").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICK = 0.005


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chunk-delay", type=float, default=0.02)
    parser.add_argument("--admissions", type=int, default=1000)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/llm_budgets_async_bench"
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

    from llm_budgets import budgets

    budgets.set_price(
        provider="openai", model="gpt-4o", input_per_mtok=Decimal("2.5"), output_per_mtok="10"
    )
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(1_000_000), window="month")
    connection.close()  # the loop's thread-sensitive worker opens its own

    streamed = asyncio.run(_streams(args))
    print(
        f"{args.streams} concurrent guarded streams x {args.chunks} chunks, {connection.vendor}: "
        f"all done in {streamed['wall']:.2f} s; "
        f"loop lag worst {streamed['worst'] * 1000:.1f} ms ({streamed['worst_at']:.1f} s in), "
        f"p99 {streamed['p99'] * 1000:.1f} ms; "
        f"{streamed['committed']} committed"
    )
    if streamed["committed"] != args.streams:
        sys.exit("every stream must settle with a commit")

    sync_rate = _sync_admissions(args.admissions)
    connection.close()
    async_rate, lag = asyncio.run(_async_admissions(args.admissions))
    print(
        f"admission (reserve + release), {args.admissions} holds: sync one thread "
        f"{sync_rate:.0f}/s; async twins, all at once on one loop {async_rate:.0f}/s "
        f"(loop lag worst {lag * 1000:.1f} ms)"
    )


class Ticker:
    """Wakes every ``TICK`` seconds and records how late it woke."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.at: list[float] = []  # when each tick woke, from the start
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK)
            self.lags.append(max(0.0, loop.time() - before - TICK))
            self.at.append(loop.time() - start)

    def __enter__(self) -> Ticker:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    @property
    def worst(self) -> float:
        return max(self.lags, default=0.0)

    @property
    def worst_at(self) -> float:
        return self.at[self.lags.index(self.worst)] if self.lags else 0.0

    @property
    def p99(self) -> float:
        if len(self.lags) < 2:
            return self.worst
        return statistics.quantiles(self.lags, n=100, method="inclusive")[98]


async def _streams(args: argparse.Namespace) -> dict[str, Any]:
    import openai
    from asgiref.sync import sync_to_async

    from llm_budgets.integrations.openai import guard
    from llm_budgets.models import Reservation
    from llm_budgets.testing.fakes.openai_server import FakeOpenAI

    fake = FakeOpenAI()
    fake.server.socket.listen(max(128, args.streams * 2))  # every stream connects at once
    for _ in range(args.streams + 1):  # each request takes the next behaviour
        fake.then(chunks=args.chunks, delay=args.chunk_delay)
    sdk = openai.AsyncOpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-bench", max_retries=0)
    guarded = guard(sdk, tenant="acme", end_user="u-1")
    messages = [{"role": "user", "content": "Summarise this support ticket in one line, please."}]

    async def call() -> None:
        stream = await guarded.chat.completions.create(
            model="gpt-4o", messages=messages, max_completion_tokens=200, stream=True
        )
        async with stream:
            async for _chunk in stream:
                pass

    await call()  # warm-up: tokenizer, connection, the worker thread's database connection
    with Ticker() as ticker:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(call() for _ in range(args.streams)), return_exceptions=True
        )
        wall = time.perf_counter() - started
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]
    await sdk.close()
    fake.stop()
    committed = await sync_to_async(
        lambda: Reservation.objects.filter(state="committed").count() - 1  # the warm-up's
    )()
    return {
        "wall": wall,
        "worst": ticker.worst,
        "worst_at": ticker.worst_at,
        "p99": ticker.p99,
        "committed": committed,
    }


def _sync_admissions(count: int) -> float:
    from llm_budgets import budgets

    call = {"tenant": "acme", "model": "gpt-4o", "input_tokens": 100, "max_output_tokens": 200}
    budgets.reserve(**call).release()  # warm-up
    started = time.perf_counter()
    for _ in range(count):
        budgets.reserve(**call).release()
    return count / (time.perf_counter() - started)


async def _async_admissions(count: int) -> tuple[float, float]:
    from llm_budgets import budgets

    call = {"tenant": "acme", "model": "gpt-4o", "input_tokens": 100, "max_output_tokens": 200}

    async def admit() -> None:
        hold = await budgets.areserve(**call)
        await hold.arelease()

    await admit()  # warm-up
    with Ticker() as ticker:
        started = time.perf_counter()
        await asyncio.gather(*(admit() for _ in range(count)))
        rate = count / (time.perf_counter() - started)
    return rate, ticker.worst


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
