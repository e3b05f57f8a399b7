"""Admission throughput on PostgreSQL: the app's reserve+commit cycle against a hand-written floor.

Usage (from the repository root)::

    python bench/admission.py [--duration 5] [--workers 1,8,32] [--scenarios hot,spread]
                              [--repeat 5] [--stripes 8] [--rtt-ms 0,0.5,2] [--proxy-overhead]
                              [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_bench]
    python bench/admission.py --scenarios hot,spread,near-limit --workers 8,32 --repeat 5
    make bench   # hot and spread, 8 and 32 workers, 5 rounds of 4 s: docs/performance.md

The database named by ``--database-url`` is DROPPED and recreated, then migrated and seeded, so
every run starts from the same state; its name must contain ``bench``.

Scenarios (every call is under three month budgets: global, tenant, end user; limits are high
enough never to refuse):

- ``hot``: one tenant, one end user: every call locks the same three counter rows. For the app
  the three budgets are hot (issue #15, docs/design/hot-caps.md): each counter is split into
  8 stripes and a call locks one stripe of each with room, skipping busy ones.
- ``spread``: 100 tenants x 100 end users, each call for one picked at random; the global counter
  is still shared by every call. For the app the global budget is hot.
- ``near-limit``: like ``hot``, but the tenant's cap has room for only ``NEAR_CALLS`` holds at
  once, and each cycle reserves then releases: every worker fights for those few holds, so
  admissions take the exact path (every stripe locked). App only (no floor): it reports
  admissions and refusals per second, refusals made while the whole cap still had room for the
  call (*early*; must be 0) and samples, taken throughout by a separate connection, in which a
  cap's stripes summed past its limit (*overspend*; must be 0).

The floor keeps locking each budget's single row (stripe 0 of each counter), as an unstriped
admission would.

Paths, each run by N worker *processes* (forked: threads would measure the GIL, not the
database), released together by a barrier after a short warm-up, for ``--duration`` seconds:

- ``app``: ``budgets.reserve(...)`` then ``hold.commit(...)``, the public API, through Django.
- ``floor``: the same logical work in two hand-written psycopg transactions, with everything
  that does not change (counter ids, limits, price, amounts) known in advance. See ``_floor_cycle``.

Added round-trip time (``--rtt-ms 0,0.5,2``): every cell is run once per value, with that many
milliseconds added to each round trip between the callers (the workers' app and floor connections
alike) and PostgreSQL. 0 is the direct connection; any other value goes through the project's fault
proxy (``llm_budgets/testing/faultproxy.py`` as a delay line: half the time each way, chunks in
flight overlapping as on a network) on 127.0.0.1, one proxy process per worker so that the proxy is
never the bottleneck. ``--proxy-overhead`` adds a leg through the proxy with nothing added: the
proxy's own cost, to compare with the direct connection. Before the cells the bench prints each
link's measured added round trip (``SELECT 1`` on an idle connection). Seeding, the ``VACUUM``
between cells and the near-limit sampler stay on the direct connection.

Prints one row per (RTT, scenario, workers, path): cycles/s, p50 and p99 cycle latency,
whole-machine CPU per cycle (busy time from ``/proc/stat`` around the cell, divided by its
cycles: it includes PostgreSQL, the proxy and anything else the machine runs, and only this
machine when PostgreSQL is on another host), and the app's throughput as a fraction of the
floor's. Method and results: ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import multiprocessing
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_bench"

PROVIDER, MODEL = "openai", "gpt-4o"
INPUT_PER_MTOK, OUTPUT_PER_MTOK = Decimal("2.50"), Decimal("10.00")
# One call: its worst case is reserved, then a smaller actual usage is committed.
INPUT_TOKENS, MAX_OUTPUT_TOKENS = 1200, 500
USED_INPUT_TOKENS, USED_OUTPUT_TOKENS = 1100, 320
HIGH_LIMIT = Decimal("1000000000")  # never refuses
# scenario: (tenants, end users per tenant)
SHAPES = {"hot": (1, 1), "spread": (100, 100), "near-limit": (1, 1)}
STRIPES = 8  # per hot budget: the library's default; --stripes sets another
NEAR_CALLS = 4  # near-limit: holds the tenant's cap has room for at once
WARMUP_CYCLES = 5
PATHS = ("floor", "app")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

CounterKey = tuple[int, int | None, datetime]  # budget, end user of a "*" budget, period start
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class Link:
    """How the callers reach PostgreSQL in a cell: directly, or through the proxy with
    ``rtt_ms`` added to every round trip (``proxied`` with 0: the proxy's own cost)."""

    rtt_ms: float = 0.0
    proxied: bool = False

    @property
    def label(self) -> str:
        if not self.proxied:
            return "0"
        return f"{self.rtt_ms:g}" if self.rtt_ms else "0 proxy"

    @property
    def description(self) -> str:
        if not self.proxied:
            return "0 ms added (direct connection)"
        if not self.rtt_ms:
            return "0 ms added, through the proxy (its own cost)"
        return f"{self.rtt_ms:g} ms added, through the proxy ({self.rtt_ms / 2:g} ms each way)"


DIRECT = Link()


@dataclass(frozen=True)
class Target:
    """One (tenant, end user) a call is made for, with what the floor needs to know up front."""

    tenant: str
    end_user: str
    tenant_id: int
    end_user_id: int
    counter_ids: tuple[int, ...]  # the counters the app locks for this call, in pk order


@dataclass(frozen=True)
class Row:
    """A row the app wrote, for the floor to write again with a few columns replaced: the floor
    inserts exactly what the app inserts, whatever the schema has grown to."""

    table: str
    sql: str
    columns: tuple[str, ...]
    values: dict[str, Any]

    @classmethod
    def copy_of(cls, table: str, values: dict[str, Any], *, generated: str = "") -> Row:
        columns = tuple(c for c in values if c != generated)
        values = {c: Jsonb(v) if isinstance(v, dict | list) else v for c, v in values.items()}
        quoted = ", ".join(f'"{c}"' for c in columns)
        placeholders = ", ".join(["%s"] * len(columns))
        sql = f"INSERT INTO {table} ({quoted}) VALUES ({placeholders})"
        return cls(table, sql, columns, values)

    def params(self, **replace: Any) -> list[Any]:
        return [replace[c] if c in replace else self.values[c] for c in self.columns]


@dataclass(frozen=True)
class Fixed:
    """What does not change between calls; the floor takes it as given."""

    counter_table: str
    budget_table: str
    reservation: Row  # as the app wrote it at reserve
    usage: Row  # the ledger line the app wrote at commit
    amount: Decimal  # worst case held at reserve
    cost: Decimal  # actual cost charged at commit
    ttl: timedelta


@dataclass(frozen=True)
class WorkerResult:
    cycles: int
    elapsed: float
    latencies: list[float]  # seconds per reserve+commit cycle
    errors: int
    first_error: str
    refused: int = 0  # near-limit: cycles refused (BudgetExceeded)
    early: int = 0  # near-limit: refusals while the whole cap had room for the call


@dataclass(frozen=True)
class Cell:
    scenario: str
    workers: int
    path: str
    cycles_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str
    round: int = 0  # which repetition of the (floor, app) pair (``--repeat``)
    link: Link = DIRECT  # the round-trip time added to the callers' connections (``--rtt-ms``)
    cpu_ms_per_cycle: float = float("nan")  # whole machine, /proc/stat
    refused_per_s: float = 0.0
    early: int = 0
    overspend: int = 0  # invariant samples with a cap's stripes past its limit
    samples: int = 0


# --- database -------------------------------------------------------------------------------


def bench_database_name(url: str) -> str:
    """The database's name, refusing any whose name does not say ``bench``: it is dropped."""
    name = str(conninfo_to_dict(url).get("dbname") or "")
    if "bench" not in name:
        raise SystemExit(
            f"Refusing to use database {name!r}: the bench DROPS and recreates the database it "
            "is given, so its name must contain 'bench' "
            "(e.g. postgres://user@host:5432/llm_budgets_bench)."
        )
    return name


def recreate_database(url: str) -> None:
    """Drop and create the bench database, connecting to the server's ``postgres`` database."""
    name = bench_database_name(url)
    admin = make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str, prepare_threshold: int | None) -> None:
    """Django on ``url``; ``prepare_threshold`` goes to psycopg as the host's
    ``DATABASES["default"]["OPTIONS"]["prepare_threshold"]`` would (docs/operations.md)."""
    query = f"prepare_threshold={prepare_threshold}" if prepare_threshold is not None else ""
    os.environ["DATABASE_URL"] = f"{url}{'&' if '?' in url else '?'}{query}" if query else url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def vacuum(url: str) -> None:
    """Start each cell from compact tables and fresh statistics (hot rows bloat under updates)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def seed(
    url: str, scenarios: Sequence[str], stripes: int = STRIPES, *, hot: bool = True
) -> tuple[Fixed, dict[str, list[Target]]]:
    """A price, a global cap, tenants each with a cap and an each-end-user ("*") cap, their end
    users, and every counter of the current period: created up front, as admission would at each
    end user's first call, so that no measured call pays for a first sight. ``hot=False``: no
    budget is hot (one counter row each, the rows the floor locks; bench/guard.py)."""
    from django.utils import timezone

    from llm_budgets import budgets
    from llm_budgets.engine.applicable import applicable_budgets
    from llm_budgets.models import Counter, EndUser, Tenant, Window

    now = timezone.now()
    budgets.set_price(
        provider=PROVIDER,
        model=MODEL,
        input_per_mtok=INPUT_PER_MTOK,
        output_per_mtok=OUTPUT_PER_MTOK,
        effective_from=now - timedelta(days=1),
    )
    budgets.set_limit(amount=HIGH_LIMIT, window=Window.MONTH, hot=hot, stripes=stripes)
    calls: dict[str, list[tuple[str, str, int, int, list[CounterKey]]]] = {}
    for scenario in scenarios:
        tenant_count, user_count = SHAPES[scenario]
        calls[scenario] = []
        for t in range(tenant_count):
            made = budgets.ensure_tenant(tenant=f"{scenario}-t{t:03d}")
            tenant = Tenant.objects.get(pk=made.id)
            for end_user in (None, "*"):
                budgets.set_limit(
                    tenant=tenant.external_id,
                    end_user=end_user,
                    amount=HIGH_LIMIT,
                    window=Window.MONTH,
                    hot=hot and scenario != "spread",  # spread: only the global cap is hot
                    stripes=stripes,
                )
            users = EndUser.objects.bulk_create(
                EndUser(tenant=tenant, external_id=f"u{u:03d}") for u in range(user_count)
            )
            # The same budgets apply to each end user of the tenant; a "*" one counts per user.
            applicable = applicable_budgets(tenant, users[0], now)
            for user in users:
                keys = [
                    (a.budget.pk, user.pk if a.end_user else None, a.period.start)
                    for a in applicable
                ]
                calls[scenario].append(
                    (tenant.external_id, user.external_id, tenant.pk, user.pk, keys)
                )
    from llm_budgets.models import Budget

    hot_stripes = dict(Budget.objects.filter(hot=True).values_list("pk", "stripes"))
    Counter.objects.bulk_create(
        (
            Counter(budget_id=budget, end_user_id=user, period_start=start, stripe=stripe)
            for scenario_calls in calls.values()
            for *_, keys in scenario_calls
            for budget, user, start in keys
            for stripe in range(hot_stripes.get(budget, 1))
        ),
        ignore_conflicts=True,
    )
    _split(url)
    # The floor locks each budget's one row: stripe 0 of a hot budget's counter.
    counter_ids: dict[CounterKey, int] = {
        (budget, user, start): pk
        for budget, user, start, pk in Counter.objects.filter(stripe=0).values_list(
            "budget_id", "end_user_id", "period_start", "pk"
        )
    }
    targets = {
        scenario: [
            Target(tenant, user, tenant_id, user_id, tuple(sorted(counter_ids[k] for k in keys)))
            for tenant, user, tenant_id, user_id, keys in scenario_calls
        ]
        for scenario, scenario_calls in calls.items()
    }
    return _written_by_app(url, targets[scenarios[0]][0]), targets


def _split(url: str) -> None:
    """Split every hot budget's empty stripes evenly, as the first admission under each would
    (``engine.stripes.resplit``): no measured call pays for a first sight."""
    from llm_budgets.models import Budget, Counter

    counter, budget = Counter._meta.db_table, Budget._meta.db_table
    share = 'trunc(b."limit" / b.stripes, 10)'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'UPDATE {counter} c SET split_for = b."limit", allowance = {share}'
            f' + CASE WHEN c.stripe = 0 THEN b."limit" - {share} * b.stripes ELSE 0 END'
            f" FROM {budget} b WHERE b.id = c.budget_id AND b.hot"
        )


def near_limit(fixed: Fixed, targets: list[Target]) -> None:
    """Bring the near-limit tenant's cap down to room for ``NEAR_CALLS`` holds and a half (the
    first call under it takes the exact path and splits its stripes for that limit)."""
    from llm_budgets import budgets
    from llm_budgets.models import Window

    limit = fixed.amount * NEAR_CALLS + fixed.amount / 2
    budgets.set_limit(tenant=targets[0].tenant, amount=limit, window=Window.MONTH)


def _written_by_app(url: str, target: Target) -> Fixed:
    """One call through the app; the floor will write copies of the rows it wrote."""
    from llm_budgets.models import Budget, Counter, Reservation, UsageRecord

    reservation_id = _app_cycle(target)
    reservation_table, usage_table = Reservation._meta.db_table, UsageRecord._meta.db_table
    with psycopg.connect(url, row_factory=dict_row) as conn:
        held = conn.execute(
            f"SELECT * FROM {reservation_table} WHERE id = %s", [reservation_id]
        ).fetchone()
        line = conn.execute(
            f"SELECT * FROM {usage_table} WHERE reservation_id = %s", [reservation_id]
        ).fetchone()
    if held is None or line is None:
        raise RuntimeError("the app's reserve and commit wrote no reservation or ledger line")
    return Fixed(
        counter_table=Counter._meta.db_table,
        budget_table=Budget._meta.db_table,
        reservation=Row.copy_of(reservation_table, held),
        usage=Row.copy_of(usage_table, line, generated="id"),
        amount=held["amount"],
        cost=line["cost"],
        ttl=held["expires_at"] - held["created_at"],
    )


# --- the two paths --------------------------------------------------------------------------


def _reserve(target: Target) -> Any:
    from llm_budgets import budgets

    return budgets.reserve(
        tenant=target.tenant,
        end_user=target.end_user,
        provider=PROVIDER,
        model=MODEL,
        input_tokens=INPUT_TOKENS,
        max_output_tokens=MAX_OUTPUT_TOKENS,
    )


def _app_cycle(target: Target) -> uuid.UUID:
    hold = _reserve(target)
    hold.commit(input_tokens=USED_INPUT_TOKENS, output_tokens=USED_OUTPUT_TOKENS)
    return hold.id


def _near_cycle(target: Target) -> bool:
    """near-limit: reserve, then release at once; returns whether the call was admitted. A
    refusal made while the whole cap had room for the call raises ``EarlyRefusal``."""
    from llm_budgets.exceptions import BudgetExceeded

    try:
        hold = _reserve(target)
    except BudgetExceeded as exc:
        if exc.remaining >= exc.requested:
            raise EarlyRefusal(f"refused with {exc.remaining} left for {exc.requested}") from exc
        return False
    hold.release()
    return True


class EarlyRefusal(Exception):
    """near-limit: a refusal while the cap as a whole had room (guarantee 2 broken)."""


def _floor_cycle(conn: psycopg.Connection[Any], fixed: Fixed, target: Target) -> None:
    """The minimum the ledger must do for one call, in two transactions.

    Reserve: lock the call's counters in pk order (``FOR UPDATE``, reading each one's limit),
    check ``spent + reserved + amount <= limit`` on each, add the amount to ``reserved``, insert
    the reservation row. Commit: mark the reservation committed only if it is still held (the
    exactly-once guard), lock the counters in pk order, move the hold to ``spent``, insert the
    ledger line. The rows inserted are copies of those the app wrote; the counter ids stay in
    memory between the two transactions (the app writes hold rows instead).
    """
    counter, ids, rid = fixed.counter_table, list(target.counter_ids), uuid.uuid4()
    who = {"tenant_id": target.tenant_id, "end_user_id": target.end_user_id}
    created = datetime.now(UTC)
    with conn.transaction():
        rows = conn.execute(
            f'SELECT c.spent, c.reserved, b."limit" FROM {counter} c '
            f"JOIN {fixed.budget_table} b ON b.id = c.budget_id "
            "WHERE c.id = ANY(%s) ORDER BY c.id FOR UPDATE OF c",
            [ids],
        ).fetchall()
        if len(rows) != len(ids) or any(s + r + fixed.amount > lim for s, r, lim in rows):
            raise RuntimeError("floor: a counter is missing or would be exceeded")
        conn.execute(
            f"UPDATE {counter} SET reserved = reserved + %s WHERE id = ANY(%s)",
            [fixed.amount, ids],
        )
        conn.execute(
            fixed.reservation.sql,
            fixed.reservation.params(
                id=rid, **who, state="held", settled_at=None, idempotency_key=None,
                created_at=created, expires_at=created + fixed.ttl,
            ),
        )  # fmt: skip
    settled = datetime.now(UTC)
    with conn.transaction():
        cursor = conn.execute(
            f"UPDATE {fixed.reservation.table} SET state = 'committed', settled_at = %s "
            "WHERE id = %s AND state = 'held'",
            [settled, rid],
        )
        if cursor.rowcount != 1:
            raise RuntimeError("floor: the reservation was not held")
        conn.execute(
            f"SELECT id FROM {counter} WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
            [ids],
        )
        conn.execute(
            f"UPDATE {counter} SET reserved = reserved - %s, spent = spent + %s WHERE id = ANY(%s)",
            [fixed.amount, fixed.cost, ids],
        )
        conn.execute(
            fixed.usage.sql,
            fixed.usage.params(reservation_id=rid, **who, reserved_at=created, created_at=settled),
        )


# --- added round-trip time --------------------------------------------------------------------


def is_local(url: str) -> bool:
    """Whether PostgreSQL runs on this machine (a loopback address or a Unix socket)."""
    params = conninfo_to_dict(url)
    host = str(params.get("hostaddr") or params.get("host") or "")
    return not host or host.startswith("/") or host in LOCAL_HOSTS


def upstream_of(url: str) -> tuple[str, int]:
    """The TCP address the proxy forwards to: the URL's host (or hostaddr) and port."""
    params = conninfo_to_dict(url)
    host = str(params.get("hostaddr") or params.get("host") or "")
    port = str(params.get("port") or "5432")
    if not host or host.startswith("/") or "," in host or not port.isdigit():
        raise SystemExit(
            "--rtt-ms above 0 and --proxy-overhead need PostgreSQL over TCP: one host and port "
            "in --database-url (e.g. postgres://postgres@127.0.0.1:5432/llm_budgets_bench)."
        )
    return host, int(port)


def via_proxy(url: str, port: int) -> str:
    """``url`` through the proxy on 127.0.0.1:``port``: the host name stays (TLS checks,
    ``.pgpass``), only the address connected to changes."""
    return make_conninfo(url, hostaddr="127.0.0.1", port=str(port))


def _fine_timers() -> None:
    """Timer slack of 1 ns for this thread and the threads it starts (Linux
    ``PR_SET_TIMERSLACK``): the default 50 us would land on every delay of a fraction of a
    millisecond."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)


def _proxy_process(upstream: tuple[str, int], control: Connection) -> None:
    """One proxy in a process of its own: sends its port, then takes a latency (seconds each
    way) at a time, acknowledging each, until told ``None`` or the bench is gone."""
    _fine_timers()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from llm_budgets.testing.faultproxy import FaultProxy

    with FaultProxy(*upstream, delay_line=True) as proxy:
        control.send(proxy.port)
        while True:
            try:
                seconds = control.recv()
            except EOFError:
                return
            if seconds is None:
                return
            proxy.latency_set(seconds)
            control.send(seconds)


class ProxyPool:
    """``size`` proxies to PostgreSQL on 127.0.0.1 (``llm_budgets/testing/faultproxy.py`` as a delay
    line), each in its own process so that the pumping threads of many connections never share one
    GIL; worker ``i`` of a cell connects through proxy ``i % size``. Started before the cells,
    given each cell's round-trip time, closed at the end."""

    def __init__(self, upstream: tuple[str, int], size: int) -> None:
        context = multiprocessing.get_context("fork")
        self.controls: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.rtt_ms: float | None = None
        try:
            for _ in range(size):
                mine, theirs = context.Pipe()
                process = context.Process(
                    target=_proxy_process, args=(upstream, theirs), daemon=True
                )
                process.start()
                theirs.close()
                self.controls.append(mine)
                self.processes.append(process)
            self.ports = [int(control.recv()) for control in self.controls]
        except EOFError:
            self.close()
            raise SystemExit("a proxy process did not start (its error is above)") from None

    def set_rtt(self, rtt_ms: float) -> None:
        """Every proxy delays each chunk by half of ``rtt_ms`` each way from now on."""
        if rtt_ms == self.rtt_ms:
            return
        for control in self.controls:
            control.send(rtt_ms / 2000)
        for control in self.controls:
            control.recv()
        self.rtt_ms = rtt_ms

    def close(self) -> None:
        for control in self.controls:
            with contextlib.suppress(OSError):
                control.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)


def idle_round_trip_ms(conninfo: str, rounds: int = 200) -> float:
    """The median round trip of ``SELECT 1`` on an idle connection, in milliseconds."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for _ in range(20):
            conn.execute("SELECT 1").fetchone()
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def describe_links(url: str, links: Sequence[Link], pool: ProxyPool | None) -> list[str]:
    """Each link as set and as measured (``SELECT 1``, idle connection: a lower bound of what
    a cell pays, where busy CPUs wake the proxy later)."""
    direct = idle_round_trip_ms(url)
    lines = [f"round trip of SELECT 1 on an idle direct connection: {direct:.3f} ms (median)"]
    for link in links:
        if not link.proxied or pool is None:
            lines.append(f"RTT {link.label:<8} {link.description}")
            continue
        pool.set_rtt(link.rtt_ms)
        measured = idle_round_trip_ms(via_proxy(url, pool.ports[0])) - direct
        lines.append(f"RTT {link.label:<8} {link.description}: measured +{measured:.3f} ms")
    return lines


# --- workers ----------------------------------------------------------------------------------


def _worker(
    index: int,
    path: str,
    url: str,
    fixed: Fixed,
    targets: list[Target],
    duration: float,
    barrier: Barrier,
    queue: Any,
    port: int | None = None,
) -> None:
    from django.db import connections

    # Forked after django.setup() with DATABASE_URL set: settings and apps come with the fork,
    # connections must not (the parent closed its own; make sure none is reused).
    for conn in connections.all(initialized_only=True):
        conn.connection = None
    if port is not None:  # --rtt-ms: every connection of this worker goes through its proxy
        url = via_proxy(url, port)
        for alias in connections:
            settings = connections[alias].settings_dict
            settings["PORT"] = port
            settings["OPTIONS"] = {**settings.get("OPTIONS", {}), "hostaddr": "127.0.0.1"}
    rng = random.Random(index)
    floor_conn: psycopg.Connection[Any] | None = None
    cycle: Callable[[Target], object] = _app_cycle
    latencies: list[float] = []
    errors, first_error, cycles, refused, early = 0, "", 0, 0, 0
    try:
        if path == "floor":
            floor_conn = psycopg.connect(url, autocommit=True)
            cycle = functools.partial(_floor_cycle, floor_conn, fixed)
        elif path == "near":
            cycle = _near_cycle
        elif path == "joined":  # the app's cycle, its ledger in the caller's connection
            from django.conf import settings

            settings.LLM_BUDGETS = {
                **getattr(settings, "LLM_BUDGETS", {}),
                "LEDGER_DATABASE": "default",
            }
        for _ in range(WARMUP_CYCLES):
            cycle(rng.choice(targets))
        barrier.wait(120)
        started = time.perf_counter()
        deadline = started + duration
        now = started
        while now < deadline:
            target = rng.choice(targets)
            try:
                admitted = cycle(target)
            except EarlyRefusal as exc:
                early += 1
                first_error = first_error or f"early refusal: {exc}"
            except Exception as exc:
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
            else:
                cycles += 1
                refused += admitted is False
                latencies.append(time.perf_counter() - now)
            now = time.perf_counter()
        queue.put(
            WorkerResult(
                cycles, now - started, latencies, errors, first_error, refused=refused, early=early
            )
        )
    except BaseException as exc:
        queue.put(WorkerResult(0, 0.0, [], 1, f"{type(exc).__name__}: {exc}"))
        barrier.abort()
    finally:
        if floor_conn is not None:
            floor_conn.close()
        connections.close_all()


def run_cell(
    *,
    scenario: str,
    workers: int,
    path: str,
    url: str,
    fixed: Fixed,
    targets: list[Target],
    duration: float,
    ports: Sequence[int] = (),
) -> Cell:
    """One cell; with ``ports``, worker ``i`` connects through the proxy ``ports[i % len]``."""
    from django.db import connections

    context = multiprocessing.get_context("fork")
    # The parent waits at the barrier too, so the CPU counted is the measured cells' alone
    # (not the workers' start-up and warm-up, which cost the app more than the floor).
    barrier = context.Barrier(workers + 1)
    queue = context.Queue()
    connections.close_all()
    processes = [
        context.Process(
            target=_worker,
            args=(i, path, url, fixed, targets, duration, barrier, queue),
            kwargs={"port": ports[i % len(ports)] if ports else None},
        )
        for i in range(workers)
    ]
    sampler = _Sampler(url) if path == "near" else None
    for process in processes:
        process.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a worker failed: its result says
        barrier.wait(180)
    busy_before = _busy_seconds()
    results: list[WorkerResult] = [queue.get(timeout=duration + 300) for _ in processes]
    busy = _busy_seconds() - busy_before
    if sampler is not None:
        sampler.stop()
    for process in processes:
        process.join(60)
    latencies = sorted(x for r in results for x in r.latencies)
    cycles = sum(r.cycles for r in results)
    return Cell(
        scenario=scenario,
        workers=workers,
        path=path,
        # Each worker's own rate, summed: its last cycle may end a little after the deadline.
        cycles_per_s=sum(r.cycles / r.elapsed for r in results if r.elapsed > 0),
        p50_ms=_percentile(latencies, 50) * 1000,
        p99_ms=_percentile(latencies, 99) * 1000,
        errors=sum(r.errors for r in results),
        first_error=next((r.first_error for r in results if r.first_error), ""),
        # From the barrier's release to the last result: the measured cycles' CPU.
        cpu_ms_per_cycle=busy / cycles * 1000 if cycles else float("nan"),
        refused_per_s=sum(r.refused / r.elapsed for r in results if r.elapsed > 0),
        early=sum(r.early for r in results),
        overspend=sampler.overspent if sampler else 0,
        samples=sampler.samples if sampler else 0,
    )


def _busy_seconds() -> float:
    """Busy CPU time of the whole machine so far (all cores): ``/proc/stat``'s first line
    without idle and iowait."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


class _Sampler:
    """The invariant checker: on its own connection, samples every cap's stripes summed
    (one statement, one snapshot) against its limit until stopped; counts samples in which
    some cap's spent + reserved passed its limit (no call runs over here, so no overage)."""

    def __init__(self, url: str) -> None:
        import threading

        from llm_budgets.models import Budget, Counter

        counter, budget = Counter._meta.db_table, Budget._meta.db_table
        self.sql = (
            f"SELECT count(*) FROM (SELECT 1 FROM {counter} c JOIN {budget} b ON b.id = c.budget_id"
            ' GROUP BY c.budget_id, c.end_user_id, c.period_start, b."limit"'
            ' HAVING sum(c.spent + c.reserved) > b."limit") over_limit'
        )
        self.url, self.samples, self.overspent = url, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.done.is_set():
                row = conn.execute(self.sql).fetchone()
                self.samples += 1
                self.overspent += bool(row and row[0])

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def _percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(pct) - 1]


# --- report -----------------------------------------------------------------------------------


def describe_machine(url: str) -> list[str]:
    import django

    with psycopg.connect(url) as conn:
        server = {
            name: str(row[0]) if (row := conn.execute(f"SHOW {name}").fetchone()) else "?"
            for name in ("server_version", "shared_buffers", "synchronous_commit")
        }
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load}",
        f"software: Python {platform.python_version()}, Django {django.get_version()}, "
        f"psycopg {psycopg.__version__}, PostgreSQL {server['server_version']} "
        f"(shared_buffers {server['shared_buffers']}, "
        f"synchronous_commit {server['synchronous_commit']})",
    ]


def _by_link(cells: list[Cell]) -> list[Cell]:
    """The cells grouped by link (in the order the links were given), each group in run order."""
    order = {link: i for i, link in enumerate(dict.fromkeys(c.link for c in cells))}
    return sorted(cells, key=lambda c: order[c.link])


def _floor_rates(cells: list[Cell]) -> dict[tuple[Link, str, int, int], float]:
    """Each floor cell's cycles/s by (link, scenario, workers, round): an app cell's base."""
    return {
        (c.link, c.scenario, c.workers, c.round): c.cycles_per_s for c in cells if c.path == "floor"
    }


def print_table(cells: list[Cell]) -> None:
    """One row per cell; an app cell's ratio is to the floor cell of its round and link.
    ``RTT ms``: the round-trip time added to the callers' connections (``--rtt-ms``; 0 is the
    direct connection, ``0 proxy`` through the proxy with nothing added)."""
    floor = _floor_rates(cells)
    header = (
        f"{'RTT ms':<8} {'scenario':<10} {'workers':>7} {'path':<5} {'cycles/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'CPU ms/c':>8} {'app/floor':>9}"
    )
    print(header)
    print("-" * len(header))
    for c in _by_link(cells):
        base = floor.get((c.link, c.scenario, c.workers, c.round))
        ratio = f"{c.cycles_per_s / base:.2f}" if c.path == "app" and base else ""
        line = (
            f"{c.link.label:<8} {c.scenario:<10} {c.workers:>7} {c.path:<5} "
            f"{c.cycles_per_s:>9.0f} {c.p50_ms:>8.2f} {c.p99_ms:>8.2f} "
            f"{c.cpu_ms_per_cycle:>8.2f} {ratio:>9}"
        )
        if c.path == "near":
            line += (
                f"  (refused {c.refused_per_s:.0f}/s; early refusals {c.early}; "
                f"overspend {c.overspend} of {c.samples} samples)"
            )
        if c.errors:
            line += f"  ({c.errors} errors, e.g. {c.first_error})"
        print(line)


def print_ratios(cells: list[Cell]) -> None:
    """With ``--repeat``: for each RTT, every app/floor ratio of each (scenario, workers) and
    their median; then each (RTT, scenario, workers, path)'s median cycles/s and CPU per cycle."""
    cells = _by_link(cells)
    floor = _floor_rates(cells)
    ratios: dict[tuple[Link, str, int], list[float]] = {}
    for c in cells:
        base = floor.get((c.link, c.scenario, c.workers, c.round))
        if c.path == "app" and base:
            ratios.setdefault((c.link, c.scenario, c.workers), []).append(c.cycles_per_s / base)
    print(f"\n{'RTT ms':<8} {'scenario':<10} {'workers':>7} {'median':>7}  app/floor in each round")
    for (link, scenario, workers), values in ratios.items():
        each = " ".join(f"{v:.2f}" for v in values)
        print(
            f"{link.label:<8} {scenario:<10} {workers:>7} {statistics.median(values):>7.2f}  {each}"
        )
    joined = {
        (c.link, c.scenario, c.workers, c.round): c.cycles_per_s
        for c in cells
        if c.path == "joined"
    }
    if joined:
        own: dict[tuple[Link, str, int], list[float]] = {}
        for c in cells:
            base = joined.get((c.link, c.scenario, c.workers, c.round))
            if c.path == "app" and base:
                own.setdefault((c.link, c.scenario, c.workers), []).append(c.cycles_per_s / base)
        print(
            f"\n{'RTT ms':<8} {'scenario':<10} {'workers':>7} {'median':>7}  app/joined in each "
            "round (the ledger's own connection against the caller's)"
        )
        for (link, scenario, workers), values in own.items():
            each = " ".join(f"{v:.2f}" for v in values)
            print(
                f"{link.label:<8} {scenario:<10} {workers:>7} "
                f"{statistics.median(values):>7.2f}  {each}"
            )
    runs: dict[tuple[Link, str, int, str], list[Cell]] = {}
    for c in cells:
        runs.setdefault((c.link, c.scenario, c.workers, c.path), []).append(c)
    print(
        f"\n{'RTT ms':<8} {'scenario':<10} {'workers':>7} {'path':<5} {'median cycles/s':>15} "
        f"{'median CPU ms per cycle (machine)':>34}"
    )
    for (link, scenario, workers, path), group in runs.items():
        rate = statistics.median(c.cycles_per_s for c in group)
        cpu = statistics.median(c.cpu_ms_per_cycle for c in group)
        print(f"{link.label:<8} {scenario:<10} {workers:>7} {path:<5} {rate:>15.0f} {cpu:>34.2f}")


def print_near_limit(cells: list[Cell]) -> None:
    """near-limit: throughput, and the two counts that must be zero."""
    near = [c for c in _by_link(cells) if c.path == "near"]
    if not near:
        return
    print(
        f"\n{'RTT ms':<8} {'near-limit':<10} {'workers':>7} {'admitted/s':>10} {'refused/s':>9} "
        "early overspend"
    )
    by_workers: dict[tuple[Link, int], list[Cell]] = {}
    for c in near:
        by_workers.setdefault((c.link, c.workers), []).append(c)
    for (link, workers), runs in by_workers.items():
        admitted = statistics.median(c.cycles_per_s - c.refused_per_s for c in runs)
        refused = statistics.median(c.refused_per_s for c in runs)
        early, over = sum(c.early for c in runs), sum(c.overspend for c in runs)
        samples = sum(c.samples for c in runs)
        print(
            f"{link.label:<8} {'':<10} {workers:>7} {admitted:>10.0f} {refused:>9.0f} {early:>5} "
            f"{over:>9} (of {samples} samples)"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--workers", default="1,8,32", help="comma-separated worker counts")
    parser.add_argument(
        "--scenarios", default="hot,spread", help="comma-separated: hot, spread, near-limit"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL),
        help="PostgreSQL database to DROP, recreate and use (its name must contain 'bench'); "
        "default: $BENCH_DATABASE_URL or %(default)s",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each (floor, app) pair this many times, alternating, and print the median "
        "ratio: this machine's speed drifts by tens of percent within minutes",
    )
    parser.add_argument(
        "--stripes",
        type=int,
        default=STRIPES,
        help="stripes per hot budget (default %(default)s); when every stripe of a budget is "
        "busy a call takes the exact path, so more workers than stripes means more escalations",
    )
    parser.add_argument(
        "--app-prepare-threshold",
        type=lambda v: None if v.lower() == "none" else int(v),
        default=5,
        help="the app connection's psycopg prepare_threshold, a host setting (default 5, "
        "psycopg's own default and what the floor's connection uses; Django's default is "
        "none: never prepare)",
    )
    parser.add_argument(
        "--rtt-ms",
        default="0",
        help="comma-separated round-trip times in milliseconds to add between the callers and "
        "PostgreSQL, each a leg of every cell (default %(default)s: the direct connection; any "
        "other value goes through llm_budgets/testing/faultproxy.py on 127.0.0.1, half of it each "
        "way)",
    )
    parser.add_argument(
        "--proxy-overhead",
        action="store_true",
        help="also run every cell through the proxy with nothing added (the proxy's own cost) "
        "and directly (RTT 0), to compare the two",
    )
    parser.add_argument(
        "--joined",
        action="store_true",
        help="also run the app's cycle with its ledger joining the caller's connection "
        "(LEDGER_DATABASE='default', the behaviour before the ledger had its own) in each "
        "round, and print app/joined: what the ledger's own connection costs",
    )
    args = parser.parse_args(argv)
    try:
        rtts = list(dict.fromkeys(float(v) for v in args.rtt_ms.split(",")))
    except ValueError:
        parser.error(f"--rtt-ms: comma-separated milliseconds, not {args.rtt_ms!r}")
    if any(r < 0 or r != r or r == float("inf") for r in rtts):
        parser.error("--rtt-ms: round-trip times must be 0 or more")
    args.links = [Link(r, proxied=r > 0) for r in rtts]
    if args.proxy_overhead:  # right after the direct connection, which it is compared with
        if DIRECT not in args.links:
            args.links.insert(0, DIRECT)
        args.links.insert(args.links.index(DIRECT) + 1, Link(0.0, proxied=True))
    args.workers = [int(w) for w in args.workers.split(",")]
    args.scenarios = [s.strip() for s in args.scenarios.split(",")]
    if unknown := set(args.scenarios) - set(SHAPES):
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    if (
        any(w < 1 for w in args.workers)
        or args.duration <= 0
        or args.repeat < 1
        or args.stripes < 1
    ):
        parser.error("workers, duration, repeat and stripes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    url: str = args.database_url
    links: list[Link] = args.links
    bench_database_name(url)
    proxied = any(link.proxied for link in links)
    upstream = upstream_of(url) if proxied else None
    began = time.monotonic()
    recreate_database(url)
    setup_django(url, args.app_prepare_threshold)
    fixed, targets = seed(url, args.scenarios, args.stripes)
    if "near-limit" in targets:
        near_limit(fixed, targets["near-limit"])
    for line in describe_machine(url):
        print(line)
    if not is_local(url):
        print(
            "PostgreSQL is on another host: CPU ms/c below is this machine's only (/proc/stat "
            "of the callers' machine), not the database server's"
        )
    print(
        f"app connection: prepare_threshold {args.app_prepare_threshold}; "
        f"{args.stripes} stripes per hot budget"
    )
    print(
        f"cells: {args.duration:g} s each after {WARMUP_CYCLES} warm-up cycles per worker; "
        f"hold {fixed.amount} USD, commit {fixed.cost} USD"
    )
    cells: list[Cell] = []
    with contextlib.ExitStack() as stack:
        pool: ProxyPool | None = None
        if upstream is not None:
            from django.db import connections

            connections.close_all()  # the proxies are forked: no connection goes with them
            pool = ProxyPool(upstream, max(args.workers))
            stack.callback(pool.close)
            print(
                f"proxy: llm_budgets/testing/faultproxy.py as a delay line, {len(pool.ports)} "
                f"processes on 127.0.0.1 (one per worker) to {upstream[0]}:{upstream[1]}"
            )
        if proxied or len(links) > 1:
            for line in describe_links(url, links, pool):
                print(line)
        print()
        for scenario in args.scenarios:
            for workers in args.workers:
                for round_ in range(args.repeat):
                    for link in links:  # alternating within each round, as floor and app do
                        if pool is not None and link.proxied:
                            pool.set_rtt(link.rtt_ms)
                        ports = pool.ports if pool is not None and link.proxied else ()
                        paths = PATHS + (("joined",) if args.joined else ())
                        for path in ("near",) if scenario == "near-limit" else paths:
                            vacuum(url)
                            cell = run_cell(
                                scenario=scenario,
                                workers=workers,
                                path=path,
                                url=url,
                                fixed=fixed,
                                targets=targets[scenario],
                                duration=args.duration,
                                ports=ports,
                            )
                            cell = dataclasses.replace(cell, round=round_, link=link)
                            cells.append(cell)
                            print(
                                f"  RTT {link.label} {scenario} x{workers} {path}: "
                                f"{cell.cycles_per_s:.0f} cycles/s",
                                file=sys.stderr,
                            )
    print_table(cells)
    if args.repeat > 1:
        print_ratios(cells)
    print_near_limit(cells)
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"the whole run took {(time.monotonic() - began) / 60:.1f} minutes")


if __name__ == "__main__":
    main()
