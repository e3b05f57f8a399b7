"""CPU and statements per app cycle (reserve + commit), one process, on PostgreSQL.

Usage (from the repository root)::

    python bench/cycle_profile.py [--scenario hot|spread] [--cycles 2000] [--stripes 32]
                                  [--profile] [--database-url postgres://.../lb_cycle_bench]

Seeds as ``bench/admission.py`` does (the database is DROPPED and recreated; its name must say
``bench``), then runs the app's cycle alone and prints, per cycle: the client's CPU
(``process_time``), the PostgreSQL backend's CPU (from ``/proc/<backend pid>/stat``: the server
must run on this machine), statements and round trips (a pipelined batch counts once) for
reserve and for commit; then the client CPU of the same statements replayed with psycopg alone
(the cycle's SQL, its round trips and transactions, without the app's Python around it: the
part of the cycle's cost the statements themselves set). CPU, not wall time: it holds on a
shared machine. With ``--profile``, the client's top functions (cProfile, cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import admission as bench
import psycopg

TICKS = os.sysconf("SC_CLK_TCK")
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


class _Counter:
    """Counts statements and round trips: a psycopg pipeline sends its batch in one; a COMMIT
    sent on its own (not queued in a pipeline) is one more."""

    active: _Counter | None = None

    def __init__(self) -> None:
        self.statements = 0
        self.trips = 0
        self._pipeline: object = None

    def __call__(self, execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        self.statements += 1
        pipeline = getattr(context["connection"].connection, "_pipeline", None)
        if pipeline is None or pipeline is not self._pipeline:
            self.trips += 1
        self._pipeline = pipeline
        return execute(sql, params, many, context)

    @classmethod
    def patch_commit(cls) -> None:
        commit = psycopg.Connection.commit

        def counted(conn: psycopg.Connection) -> None:
            idle = conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if cls.active is not None and not idle and conn._pipeline is None:
                cls.active.trips += 1
            commit(conn)

        psycopg.Connection.commit = counted  # type: ignore[method-assign,assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="hot", choices=["hot", "spread"])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--stripes", type=int, default=32)
    parser.add_argument("--path", default="app", choices=["app", "floor"])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lb_cycle_bench"
        ),
    )
    args = parser.parse_args()
    bench.recreate_database(args.database_url)
    bench.setup_django(args.database_url, 5)
    fixed, targets = bench.seed(args.database_url, [args.scenario], args.stripes)
    if args.path == "floor":
        _floor(args, fixed, targets[args.scenario])
        return
    from llm_budgets import budgets
    from llm_budgets.db.ledger import ledger_db

    rng = random.Random(1)
    pool = targets[args.scenario]
    for _ in range(50):  # warm: prepared statements, caches
        bench._app_cycle(rng.choice(pool))
    connection = ledger_db()  # where the cycle's statements go (issue 37)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    reserve_count, commit_count = _Counter(), _Counter()
    picked = [rng.choice(pool) for _ in range(args.cycles)]
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    server0, client0, wall0 = _backend_cpu(backend), time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    _Counter.patch_commit()
    for target in picked:
        with connection.execute_wrapper(reserve_count):
            _Counter.active = reserve_count
            hold = bench._reserve(target)
        with connection.execute_wrapper(commit_count):
            _Counter.active = commit_count
            hold.commit(
                input_tokens=bench.USED_INPUT_TOKENS, output_tokens=bench.USED_OUTPUT_TOKENS
            )
    if profiler:
        profiler.disable()
    client = time.process_time() - client0
    server = _backend_cpu(backend) - server0
    wall = time.perf_counter() - wall0
    n = args.cycles
    print(f"{args.scenario}, {args.stripes} stripes, {n} cycles, one process")
    print(
        f"client CPU {client / n * 1000:.3f} ms/cycle, backend CPU {server / n * 1000:.3f} ms/cycle"
        f" (tick {1000 / TICKS:.0f} ms), wall {wall / n * 1000:.3f} ms/cycle"
    )
    for name, c in (("reserve", reserve_count), ("commit", commit_count)):
        print(f"{name}: {c.statements / n:.2f} statements, {c.trips / n:.2f} round trips")
    replayed = _replay(args.database_url, _recorded(rng.choice(pool)), n)
    print(
        f"the same statements replayed with psycopg alone: client CPU {replayed * 1000:.3f} "
        "ms/cycle (what the cycle's SQL costs the client without the app's Python around it)"
    )
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    del budgets
    if profiler:
        profiler.dump_stats("/tmp/cycle.prof")
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)


@dataclass(frozen=True)
class _Sent:
    """A statement of the app's cycle as psycopg sent it: the pipeline it went in (None: sent on
    its own), and whether psycopg began a transaction before it (Django's ``atomic()`` turns
    autocommit off; psycopg sends the BEGIN with the next statement)."""

    query: str
    params: tuple[Any, ...]
    pipeline: int | None
    begins: bool


def _recorded(target: bench.Target) -> tuple[list[_Sent], uuid.UUID]:
    """The statements one app cycle sends, in order, and the id of its reservation."""
    sent: list[_Sent] = []
    execute = psycopg.Cursor.execute

    def recording(cursor, query, params=None, **kwargs):  # type: ignore[no-untyped-def]
        text = query if isinstance(query, str) else query.as_string(cursor)
        conn = cursor.connection
        pipeline = None if conn._pipeline is None else id(conn._pipeline)
        idle = conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        sent.append(_Sent(text, tuple(params or ()), pipeline, not conn.autocommit and idle))
        return execute(cursor, query, params, **kwargs)

    psycopg.Cursor.execute = recording  # type: ignore[method-assign,assignment]
    try:
        reservation = bench._app_cycle(target)
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    return sent, reservation


def _replay(url: str, recorded: tuple[list[_Sent], uuid.UUID], cycles: int) -> float:
    """Client CPU per cycle of sending ``recorded`` again, ``cycles`` times, on a psycopg
    connection of its own (``prepare_threshold`` 5, as the app's): in the same round trips (a
    pipeline's statements together) and transactions (a BEGIN where psycopg sent one, the app's
    own COMMIT), each cycle with a new reservation id, reading every result. The counters'
    writes set what the recorded cycle set, so the counters stay as they were; the ledger lines
    pile up as the app's do."""
    statements, reservation = recorded
    trips: list[list[_Sent]] = []
    for sent in statements:
        if trips and sent.pipeline is not None and trips[-1][-1].pipeline == sent.pipeline:
            trips[-1].append(sent)
        else:
            trips.append([sent])

    def fresh(params: tuple[Any, ...], new: uuid.UUID) -> tuple[Any, ...]:
        return tuple(new if value == reservation else value for value in params)

    with psycopg.connect(url, autocommit=True, prepare_threshold=5) as conn:

        def send(cursor: psycopg.Cursor[Any], sent: _Sent, new: uuid.UUID) -> None:
            if sent.begins:
                conn.execute("BEGIN")
            cursor.execute(sent.query, fresh(sent.params, new))

        def cycle() -> None:
            new = uuid.uuid4()
            for trip in trips:
                cursors = [conn.cursor() for _ in trip]
                if trip[0].pipeline is None:  # sent on its own: a trip of one
                    send(cursors[0], trip[0], new)
                else:
                    with conn.pipeline():
                        for cursor, sent in zip(cursors, trip, strict=True):
                            send(cursor, sent, new)
                for cursor in cursors:
                    if cursor.pgresult is not None and cursor.pgresult.status == _TUPLES_OK:
                        cursor.fetchall()

        for _ in range(min(cycles, 50)):  # warm: prepared statements
            cycle()
        client0 = time.process_time()
        for _ in range(cycles):
            cycle()
        return (time.process_time() - client0) / cycles


def _floor(args: argparse.Namespace, fixed: bench.Fixed, pool: list[bench.Target]) -> None:
    """The hand-written floor's cycle (``bench/admission.py``), measured the same way."""
    rng = random.Random(1)
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        for _ in range(50):
            bench._floor_cycle(conn, fixed, rng.choice(pool))
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        picked = [rng.choice(pool) for _ in range(args.cycles)]
        server0, client0 = _backend_cpu(backend), time.process_time()
        for target in picked:
            bench._floor_cycle(conn, fixed, target)
        client, server = time.process_time() - client0, _backend_cpu(backend) - server0
    n = args.cycles
    print(f"floor, {args.scenario}, {n} cycles, one process")
    print(
        f"client CPU {client / n * 1000:.3f} ms/cycle, backend CPU {server / n * 1000:.3f} ms/cycle"
    )
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
