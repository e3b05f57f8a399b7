"""The ledger's failure boundary: an *operational* database failure (the database unreachable or
shutting down, a lock wait cut short, a serialisation failure or deadlock, resources exhausted)
becomes ``LedgerUnavailable`` (fail closed, retry later), and lock waits are bounded by
``LOCK_TIMEOUT_SECONDS`` on every backend.

Any other database error (``ProgrammingError``, ``DataError``, ``IntegrityError``, an SQLite
"no such table") is a fault in our SQL, schema or data, not an outage: it is logged with its
traceback and raised as it is, so it is fixed rather than retried. Either way nothing is held.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.db.ledger import ledger_connection
from llm_budgets.exceptions import LedgerUnavailable

logger = logging.getLogger("llm_budgets")


# PostgreSQL SQLSTATEs (and classes, by their first two characters) that say the database could
# not serve the statement now, whatever the statement: retrying later may succeed.
_PG_OPERATIONAL_CLASSES = frozenset({"08", "40", "53", "57", "58"})  # connection, rollback
# (serialisation failure, deadlock), insufficient resources, operator intervention (admin or
# crash shutdown, statement timeout, cancel), system (I/O) error
_PG_OPERATIONAL_STATES = frozenset(
    {"55P03", "25P03", "25P04"}  # lock_timeout, idle-in-transaction and transaction timeouts
)
# SQLite primary result codes with the same meaning: busy/locked (the write lock's busy timeout),
# out of memory, read-only, interrupted, I/O error, corrupt, disk full, cannot open, protocol.
_SQLITE_OPERATIONAL_CODES = frozenset({5, 6, 7, 8, 9, 10, 11, 13, 14, 15})
# How many times a ledger transaction chosen as a deadlock's victim is run again before the
# call is refused. One victim is rolled back and the other goes on, so a second try nearly
# always succeeds.
DEADLOCK_RETRIES = 2

P = ParamSpec("P")
T = TypeVar("T")


def operational(exc: DatabaseError) -> bool:
    """Whether ``exc`` says the database could not serve us now (an outage, a lock wait cut
    short, a serialisation failure), as opposed to a fault in our own SQL or data.

    Read from the driver's error Django wraps (``exc.__cause__``): PostgreSQL's SQLSTATE,
    SQLite's result code. A driver error without one (a connection lost or closed, which psycopg
    raises as ``OperationalError`` or ``InterfaceError`` with no SQLSTATE) is operational."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate[:2] in _PG_OPERATIONAL_CLASSES or sqlstate in _PG_OPERATIONAL_STATES
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _SQLITE_OPERATIONAL_CODES
    return isinstance(exc, OperationalError | InterfaceError)


def deadlocked(exc: BaseException | None) -> bool:
    """Whether ``exc`` (Django's error or the driver's) is PostgreSQL choosing this transaction
    as a deadlock's victim (SQLSTATE 40P01). Its transaction was rolled back whole, so running
    it again is safe. Lock order is canonical (pk order), but PostgreSQL's ``SKIP LOCKED`` still
    waits, whatever the wait policy, when it follows a row's update chain to a version another
    transaction locks ("while locking updated version ... of tuple"): the hot caps' stripe pick
    can then close a cycle with a transaction that holds stripes in pk order."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) == "40P01" or getattr(exc, "pgcode", None) == "40P01":
            return True
        exc = exc.__cause__
    return False


def retrying_deadlocks(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` (one ledger transaction, behind ``ledger_guard``) again, up to
    ``DEADLOCK_RETRIES`` times, when PostgreSQL rolled it back as a deadlock's victim; any other
    refusal is raised at once."""

    @functools.wraps(function)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(DEADLOCK_RETRIES):
            try:
                return function(*args, **kwargs)
            except LedgerUnavailable as exc:
                if not deadlocked(exc.__cause__):
                    raise
                deadlock_retried(function.__name__, attempt + 1)
        return function(*args, **kwargs)

    return retrying


def deadlock_retried(what: str, attempt: int) -> None:
    logger.warning(
        "llm_budgets: %s was a deadlock's victim; running it again (%d of %d)",
        what,
        attempt,
        DEADLOCK_RETRIES,
    )


@contextmanager
def ledger_guard(action: str) -> Iterator[None]:
    """Turn an operational database failure into a refusal that explains itself; let any
    other database error surface as the error it is (logged with its traceback)."""
    try:
        yield
    except DatabaseError as exc:
        if not operational(exc):
            logger.exception(
                "llm_budgets: database error during %s (a fault in the query, schema or data, "
                "not an outage: not retried)",
                action,
            )
            raise
        fix = _sqlite_lock_fix(exc)
        # A deadlock's victim is run again by its caller (``retrying_deadlocks``): no traceback.
        victim = deadlocked(exc)
        logger.log(
            logging.WARNING if victim else logging.ERROR,
            "llm_budgets: ledger unavailable during %s: %s%s",
            action,
            exc,
            fix,
            exc_info=not victim,
        )
        raise LedgerUnavailable(
            f"The budget ledger could not be read or written during {action} "
            f"({type(exc).__name__}: {str(exc).strip() or 'no detail'}). {_left(action)}{fix}",
            retry_after=max(1, int(conf.LOCK_TIMEOUT_SECONDS)),
        ) from exc


# The actions a refusal's message tells apart (issue #38): the database may commit a write and
# lose its answer (a connection cut after COMMIT), so a refused write is "unknown", never
# "nothing changed".
SETTLEMENTS = frozenset({"commit", "release", "extend", "mark uncertain"})
# Reads, and the REST layer's steps before a request runs (its key, its rate, its
# Idempotency-Key): what the request asked for was not done.
NOT_RUN = frozenset({"read", "quote", "status", "authentication", "throttle", "idempotency"})


def _left(action: str) -> str:
    """What a refused ``action`` may have left behind, and how to retry it safely."""
    if action in SETTLEMENTS:
        return (
            "Its outcome is unknown: the database may have applied it before its answer was "
            "lost. Retry the same request: settling is idempotent (a reservation settled "
            "already answers as it was settled)."
        )
    if action == "admission":
        return (
            "The call was refused. If the database took the hold before its answer was lost, "
            "the hold exists: retry with the same idempotency key to get that hold back (a new "
            "key holds again; an unclaimed hold expires and is charged as estimated)."
        )
    if action in NOT_RUN:
        return "Nothing the request asked for was done; retry shortly."
    return (
        "Its outcome is unknown: the database may have applied it before its answer was lost. "
        "Check before repeating it."
    )


def _sqlite_lock_fix(exc: DatabaseError) -> str:
    """What to change when SQLite said "database is locked" because it was not told to take its
    write lock at BEGIN: a deferred transaction that later needs to write fails at once, without
    waiting for the busy timeout, so concurrent calls are refused instead of queued."""
    if connection.vendor != "sqlite":
        return ""
    code = getattr(exc.__cause__, "sqlite_errorcode", None)
    if not (isinstance(code, int) and code & 0xFF in (5, 6)):  # SQLITE_BUSY, SQLITE_LOCKED
        return ""
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    if str(mode).upper() == "IMMEDIATE":
        return ""
    return (
        " Cause: SQLite is not set to take its write lock at BEGIN, so concurrent calls fail "
        "with 'database is locked' instead of waiting their turn. Fix: DATABASES['default']"
        "['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', 'timeout': 5} (check "
        "llm_budgets.W001), or PostgreSQL."
    )


def bound_sqlite_wait() -> None:
    """SQLite takes its write lock at BEGIN, so its busy timeout must be set before the block."""
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(conf.LOCK_TIMEOUT_SECONDS * 1000)}")


@contextmanager
def ledger_transaction(
    *, unwritten: tuple[type[BaseException], ...] = (), bounded: bool = True
) -> Iterator[None]:
    """``transaction.atomic()`` for a ledger write (admission, settlement, the sweep), its lock
    waits bounded by ``LOCK_TIMEOUT_SECONDS``.

    ``unwritten``: exceptions the block raises only before it has written anything (a refusal,
    a retry on another path). The transaction then ends with a COMMIT rather than a rollback
    where it is the caller's own (``statements.commit_unwritten``: psycopg 3 answers a ROLLBACK
    by deallocating every prepared statement of the connection), and the exception is raised
    after it.

    On SQLite its BEGIN takes the write lock (``BEGIN IMMEDIATE``) whatever the host's
    ``transaction_mode``: a deferred transaction that reads and then writes fails at once with
    "database is locked" when another writer is ahead (SQLite does not wait there, to avoid a
    deadlock), so concurrent calls were refused as ``LedgerUnavailable`` instead of queueing for
    the busy timeout and being admitted or refused on the budget. Only this transaction's BEGIN
    changes; the host's own transactions keep their mode.

    It runs on the ledger's own connection (``db.ledger``), never inside the caller's
    transaction: it commits when the block ends, whatever the caller then does. ``bounded``:
    its first statement bounds its lock waits (``bound_lock_wait``), its commit's included (a
    foreign key checked at commit waits for a row the caller's own transaction locked: without
    the bound, forever). Admission and settlement pass False: they send the bound with their
    first statement, in its round trip."""
    with ledger_connection(), _transaction(unwritten):
        if bounded:
            bound_lock_wait()
        yield


@contextmanager
def _transaction(unwritten: tuple[type[BaseException], ...]) -> Iterator[None]:
    bound_sqlite_wait()
    wrapper: Any = connection  # the SQLite wrapper's transaction_mode (Django >= 5.1)
    mode = getattr(wrapper, "transaction_mode", "IMMEDIATE")
    if connection.vendor != "sqlite" or connection.in_atomic_block or mode == "IMMEDIATE":
        left: BaseException | None = None
        with transaction.atomic():
            try:
                yield
            except unwritten as exc:
                if not sql.commit_unwritten():
                    raise
                left = exc
        if left is not None:
            raise left
        return
    wrapper.transaction_mode = "IMMEDIATE"
    try:
        with transaction.atomic():
            wrapper.transaction_mode = mode  # BEGIN has been sent
            yield
    finally:
        wrapper.transaction_mode = mode


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Reads that must agree with each other (the conservation check): one transaction and, on
    PostgreSQL, one snapshot. Its default isolation (READ COMMITTED) takes a snapshot per
    statement, so a settlement committing between two reads would look like drift. Inside a
    caller's transaction the caller's isolation stands (it can no longer be changed)."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def lock_timeout_statement() -> sql.Statement | None:
    """The statement ``bound_lock_wait`` runs, to send ahead of the transaction's first locking
    statement in one round trip (``statements.fetch(..., first=...)``); None where not needed."""
    if connection.vendor != "postgresql":
        return None
    return "SELECT set_config('lock_timeout', %s, true)", [_lock_timeout()]


def bound_lock_wait() -> None:
    """Inside the transaction, first: wait at most LOCK_TIMEOUT_SECONDS for any lock (PostgreSQL).

    Its own statement, not folded into the next one: a statement takes its table locks (e.g.
    behind a migration's ``ALTER TABLE``) before it runs, so only an earlier statement can bound
    those waits. ``lock_timeout_statement`` sends it in the same round trip as the next one."""
    bound = lock_timeout_statement()
    if bound is not None:
        sql.execute(*bound)


def _lock_timeout() -> str:
    return f"{int(conf.LOCK_TIMEOUT_SECONDS * 1000)}ms"
