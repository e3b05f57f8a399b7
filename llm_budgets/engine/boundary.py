"""The ledger's failure boundary: any database error becomes ``LedgerUnavailable`` (fail closed),
and lock waits are bounded by ``LOCK_TIMEOUT_SECONDS`` on every backend."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connection

from llm_budgets.conf import conf
from llm_budgets.engine import statements as sql
from llm_budgets.exceptions import LedgerUnavailable

logger = logging.getLogger("llm_budgets")


@contextmanager
def ledger_guard(action: str) -> Iterator[None]:
    """Turn a database failure into a refusal that explains itself."""
    try:
        yield
    except DatabaseError as exc:
        logger.error("llm_budgets: ledger unavailable during %s: %s", action, exc)
        raise LedgerUnavailable(
            f"The budget ledger could not be read or written during {action} "
            f"({type(exc).__name__}: {str(exc).strip() or 'no detail'}). The call was refused; "
            "retry shortly.",
            retry_after=max(1, int(conf.LOCK_TIMEOUT_SECONDS)),
        ) from exc


def bound_sqlite_wait() -> None:
    """SQLite takes its write lock at BEGIN, so its busy timeout must be set before the block."""
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(conf.LOCK_TIMEOUT_SECONDS * 1000)}")


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
