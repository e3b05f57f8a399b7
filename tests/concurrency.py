"""Real concurrency: threads or processes released together by a barrier, each on its own
database connection. Used only by tests marked ``django_db(transaction=True)``."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Sum
from django.test import override_settings

from llm_budgets.engine.counters import rows_by_key
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import BudgetRaise, Counter, UsageRecord
from llm_budgets.money import MILLION, ZERO, round_charge, round_hold
from llm_budgets.usage import input_allowed


def outside_connection(*, autocommit: bool = False) -> Any:
    """A psycopg connection of its own to the test database (PostgreSQL), outside Django's: it
    sees only what is committed and holds its own locks. Close it (``with``)."""
    import psycopg

    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"],
        dbname=db["NAME"],
        autocommit=autocommit,
    )


def run_threads(count: int, work: Callable[[int], Any], *, timeout: float = 60) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads started at the same instant. Returns each result or
    the exception it raised, in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def target(index: int) -> None:
        try:
            barrier.wait(timeout)
            results[index] = work(index)
        except BaseException as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    return results


def _process_target(work: Callable[[int], Any], index: int, barrier: Any, queue: Any) -> None:
    # A forked child must not reuse the parent's sockets: drop them unclosed and reconnect.
    for conn in connections.all(initialized_only=True):
        conn.connection = None
    try:
        barrier.wait(60)
        queue.put((index, "ok", work(index)))
    except BaseException as exc:
        queue.put((index, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def run_processes(
    count: int, work: Callable[[int], Any], *, timeout: float = 120
) -> list[tuple[str, Any]]:
    """Run ``work(i)`` in ``count`` forked processes started together. Returns ``(status, value)``
    per index, where status is ``"ok"`` or ``"error"`` (value: the exception's name and text)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(count)
    queue = context.Queue()
    connections.close_all()
    processes = [
        context.Process(target=_process_target, args=(work, i, barrier, queue))
        for i in range(count)
    ]
    for process in processes:
        process.start()
    results: list[tuple[str, Any]] = [("error", "no result")] * count
    for _ in range(count):
        index, status, value = queue.get(timeout=timeout)
        results[index] = (status, value)
    for process in processes:
        process.join(timeout)
    return results


@contextmanager
def patient_lock_waits(seconds: float = 30) -> Iterator[None]:
    """Raise LOCK_TIMEOUT_SECONDS for a race whose point is what gets admitted, not how long a
    lock wait may last (tests/test_fail_closed.py tests that): on a loaded machine, SQLite's
    busy wait among dozens of writers can pass the default bound and refuse with
    LedgerUnavailable. Forked processes inherit it."""
    with override_settings(
        LLM_BUDGETS={**getattr(settings, "LLM_BUDGETS", {}), "LOCK_TIMEOUT_SECONDS": seconds}
    ):
        yield


def overspent_counters(ceilings: Mapping[int, Decimal] | None = None) -> list[str]:
    """Counters past what invariant 1 allows them (admission never overspends; only committed
    calls that ran over may): their budget's limit (``ceilings``: by budget id, the highest limit
    staff may have set it to meanwhile), plus every raise granted on the budget (a raise admitted
    while active stays spent after it ends), plus the overage recorded on their ledger lines. A
    hot budget's counter is the sum of its stripes, with the overage recorded on any of them. A
    prepaid balance's limit is its live credit: a staff removal never takes it below spent +
    held, so it is held to its limit as it is."""
    # Only the lines with overage (never negative: llmb_usage_overage_non_negative): the sums are
    # the same, and the join to holds covers those few lines instead of every line (the soak's
    # watcher runs this throughout a run whose ledger keeps growing).
    overage = {
        row["reservation__holds__counter"]: round_charge(row["total"] or ZERO)
        for row in UsageRecord.objects.filter(overage__gt=0, reservation__holds__isnull=False)
        .values("reservation__holds__counter")
        .annotate(total=Sum("overage"))
    }
    raised = {
        row["budget"]: row["total"] or ZERO
        for row in BudgetRaise.objects.values("budget").annotate(total=Sum("amount"))
    }
    rows = list(Counter.objects.select_related("budget").order_by("pk"))
    over = []
    for key, stripes in rows_by_key(rows).items():
        budget = stripes[0].budget
        used = sum((c.spent + c.reserved for c in stripes), ZERO)
        ran_over = sum((overage.get(c.pk, ZERO) for c in stripes), ZERO)
        limit = max(budget.limit, (ceilings or {}).get(budget.pk, budget.limit))
        granted = raised.get(budget.pk, ZERO)
        if used > limit + granted + ran_over:
            over.append(
                f"counter {[c.pk for c in stripes]} ({budget}, {tuple(key)}): spent + reserved "
                f"{used} > limit {limit} + raises {granted} + overage {ran_over}"
            )
    return over


def worst_case(
    *, input_tokens: int, max_output_tokens: int, input_per_mtok: Decimal, output_per_mtok: Decimal
) -> Decimal:
    """A plain request's worst case as the races expect admission to hold it: its input and the
    input tolerance a commit may report beyond it (issue #38), and its output ceiling."""
    held_input = input_allowed(input_tokens) * input_per_mtok
    return round_hold((held_input + max_output_tokens * output_per_mtok) / MILLION)


def refused_early(refusal: BudgetExceeded, worst_case: Decimal) -> bool:
    """An early (or wrong) refusal: one that did not ask for the call's ``worst_case`` (the input
    tolerance included), or came while its budget, as a whole, had room for it."""
    if refusal.requested != worst_case:
        return True
    return refusal.remaining is not None and refusal.remaining >= worst_case


def lock_waited(*, others_only: bool = False, seconds: float = 30) -> bool:
    """Whether, within ``seconds``, some connection to this test database waits on a lock
    (PostgreSQL's ``pg_stat_activity``, polled): the point at which a race's second party may
    act. ``others_only``: not counting this thread's own connection."""
    condition = " AND pid <> pg_backend_pid()" if others_only else ""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                f"AND datname = current_database(){condition}"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.01)
    return False


class RowLocker:
    """Holds a write transaction open on its own thread and connection until released: on
    PostgreSQL it locks the given counter rows (``SELECT ... FOR UPDATE``); on SQLite the
    transaction's BEGIN IMMEDIATE takes the database write lock. Use as a context manager."""

    def __init__(self, counter_ids: list[int], *, timeout: float = 30) -> None:
        self.counter_ids = counter_ids
        self.timeout = timeout
        self.locked = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                list(Counter.objects.select_for_update().filter(pk__in=self.counter_ids))
                self.locked.set()
                # Bounded: if the code under test waits forever, the lock still goes away.
                self.release.wait(self.timeout)
        except BaseException as exc:
            self.error = exc
        finally:
            self.locked.set()
            connections.close_all()

    def __enter__(self) -> RowLocker:
        self._thread.start()
        assert self.locked.wait(self.timeout), "the locker never took its lock"
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()
        self._thread.join(self.timeout)
        assert not self._thread.is_alive(), "the locker did not finish"
        assert self.error is None, self.error
