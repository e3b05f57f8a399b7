"""bench/smoke.py runs every bench at a tiny size in CI; a bench it does not list would rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _smoke():
    spec = importlib.util.spec_from_file_location("bench_smoke", BENCH / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_bench_runs_in_the_smoke_run() -> None:
    smoke = _smoke()
    benches = {path.name for path in BENCH.glob("*.py")} - smoke.NOT_BENCHES
    assert benches == set(smoke.RUNS), "add the bench to RUNS in bench/smoke.py"
