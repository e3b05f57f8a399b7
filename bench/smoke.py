"""Every bench at a tiny size, so none can rot unnoticed (CI runs this: ``make bench-smoke``).

Usage (from the repository root)::

    python bench/smoke.py [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_smoke_bench]

Each bench runs in its own process with the arguments below and must exit 0 (``MORE_RUNS``: a
second run of a bench, e.g. admission.py through the fault proxy with ``--rtt-ms``, whose output
is checked too); the numbers it prints at this size mean nothing (docs/performance.md has the
real runs). The databases the benches drop and recreate are named from ``--database-url`` and
contain ``bench``.
``tests/test_bench_smoke.py`` fails when a bench in ``bench/`` is missing from ``RUNS``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_smoke_bench"

# bench file -> its tiny arguments (besides --database-url).
RUNS: dict[str, list[str]] = {
    name: line.split()
    for name, line in {
        "alerts_burst.py": "--events 50 --cycles 10 --rounds 1",
        "admission.py": "--duration 0.5 --workers 1,2 --scenarios hot,spread --repeat 1",
        "async_streams.py": "--streams 10 --chunks 3 --chunk-delay 0.01 --admissions 10",
        "cycle_profile.py": "--cycles 20 --stripes 4",
        "guard.py": "--calls 10 --big-calls 2",
        "load.py": "--clients 2 --workers 1 --duration 3 --tenants 2 --end-users 3"
        " --overhead-rounds 3 --port 8197",
        "pages.py": "--lines 200 --end-users 20 --days 3 --tail 20 --rounds 2",
        "rest_overhead.py": "--cycles 10",
        "scale.py": "--ledger 100 --users 10 --holds 50 --batch-size 20",
        "scopes.py": "--cycles 20 --workers 1,2",
        "stripe_outbox.py": "--cycles 20 --rounds 1",
    }.items()
}
# Further runs of a bench in RUNS, for a path its run above does not take: (label, bench file,
# arguments, text its output must contain). A cell's errors do not fail a bench, so these runs
# also fail on any (admission.py prints "(N errors, e.g. ...)" beside the cell).
MORE_RUNS: list[tuple[str, str, list[str], str]] = [
    (
        # through llm_budgets/testing/faultproxy.py in child processes (--rtt-ms)
        "admission.py RTT",
        "admission.py",
        [
            *("--duration", "0.3", "--workers", "1,2", "--scenarios", "hot"),
            *("--repeat", "2", "--rtt-ms", "0,0.5"),
        ],
        "0.5 ms added, through the proxy (0.25 ms each way): measured +",
    ),
    (
        "admission.py joined",  # the ledger in the caller's connection, against its own
        "admission.py",
        [
            *(
                "--duration",
                "0.3",
                "--workers",
                "1",
                "--scenarios",
                "spread",
                "--repeat",
                "2",
                "--joined",
            )
        ],
        "app/joined in each round",
    ),
]
# Modules in bench/ that are not benches of their own.
NOT_BENCHES = {"smoke.py", "load_settings.py"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args()
    failed = []
    runs = [(name, name, extra, "") for name, extra in RUNS.items()] + MORE_RUNS
    for label, name, extra, expected in runs:
        started = time.monotonic()
        command = [sys.executable, str(ROOT / name), *extra, "--database-url", args.database_url]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        print(f"{label:<18} exit {done.returncode}  {took:5.1f} s", flush=True)
        wrong = expected and (expected not in done.stdout or " errors, e.g. " in done.stdout)
        if done.returncode or wrong:
            failed.append(label)
            if wrong:
                print(f"expected {expected!r} in the output and no cell with errors", flush=True)
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", flush=True)
    if failed:
        print(f"benches that failed at a tiny size: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
