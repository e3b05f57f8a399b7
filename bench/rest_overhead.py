"""The REST API's own cost over the in-process call, without HTTP or a second process: the same
reserve+commit pair through ``budgets.reserve``/``hold.commit`` and through the API views (DRF's
test client, in this process), alternating, on PostgreSQL. Reports the median wall time and the
median CPU time of this process (``process_time``: less inflated by a loaded machine than wall
time, and the API layer's cost is CPU) per cycle, and their difference per request.

Usage (from the repository root)::

    python bench/rest_overhead.py [--cycles 200] [--profile]
                                  [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_rest_bench]

``--profile`` then runs the REST cycles under pyinstrument (``pip install pyinstrument``) and
prints where the time went. The database is DROPPED and recreated (its name must contain
``bench``). Numbers: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from load import (  # noqa: E402
    BASE,
    INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MODEL,
    PROVIDER,
    RESERVE_BODY,
    _django,
    _recreate,
    price_set,
)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_rest_bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    _recreate(args.database_url)
    _django(args.database_url)
    from decimal import Decimal

    from rest_framework.test import APIClient

    from llm_budgets import budgets
    from llm_budgets.control.api_keys import api_key_create

    price_set()
    budgets.ensure_tenant(tenant="t0", name="T0")
    budgets.set_limit(tenant="t0", amount=Decimal("100000000"), window="month")
    _, key = api_key_create(tenant="t0", name="overhead")
    from django.conf import settings
    from django.test import override_settings

    # The throttle stays on (its cost is part of every request), at a rate this bench stays under.
    override_settings(
        LLM_BUDGETS={**settings.LLM_BUDGETS, "API_THROTTLE_RATE": "1000000/minute"}
    ).enable()
    client = APIClient(HTTP_AUTHORIZATION=f"Api-Key {key}", HTTP_HOST="127.0.0.1")
    usage = {"input_tokens": INPUT_TOKENS, "output_tokens": 100}

    def in_process() -> None:
        hold = budgets.reserve(
            tenant="t0",
            provider=PROVIDER,
            model=MODEL,
            input_tokens=INPUT_TOKENS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )
        hold.commit(**usage)

    def rest() -> None:
        reserved = client.post(f"{BASE}reservations", RESERVE_BODY, format="json")
        assert reserved.status_code == 201, reserved.content
        rid = reserved.json()["id"]
        committed = client.post(f"{BASE}reservations/{rid}/commit", usage, format="json")
        assert committed.status_code == 200, committed.content

    timings: dict[str, list[tuple[float, float]]] = {"in-process": [], "REST": []}
    for _ in range(10):  # warm both paths (caches, prepared statements, the schema)
        in_process()
        rest()
    for _ in range(args.cycles):
        for name, cycle in (("in-process", in_process), ("REST", rest)):
            wall, cpu = time.perf_counter(), time.process_time()
            cycle()
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))

    print(f"rest overhead: {args.cycles} alternating cycles, load average {os.getloadavg()}")
    medians = {}
    for name, rows in timings.items():
        wall = statistics.median(r[0] for r in rows) * 1000
        cpu = statistics.median(r[1] for r in rows) * 1000
        medians[name] = (wall, cpu)
        print(f"  {name:<11} reserve+commit  wall p50 {wall:7.2f} ms   CPU p50 {cpu:7.2f} ms")
    wall = (medians["REST"][0] - medians["in-process"][0]) / 2
    cpu = (medians["REST"][1] - medians["in-process"][1]) / 2
    print(f"  REST overhead per request: wall {wall:.2f} ms, CPU {cpu:.2f} ms")

    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(args.cycles):
            rest()
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
