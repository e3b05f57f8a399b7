"""Reads that may come from a read replica (docs/scaling.md).

Add ``"llm_budgets.routers.ReplicaRouter"`` to ``DATABASE_ROUTERS`` and name the replica's alias
in ``LLM_BUDGETS["READ_REPLICA"]``. Nothing moves by itself: only code run inside
:func:`replica_reads` reads from the replica (pages, rollups, reconciliation reports, exports:
reads where a few seconds of replication lag are acceptable). Admission, settlement and every
other write path keep reading the primary, where the rows they lock live; a read inside a
transaction on the primary stays on the primary even within ``replica_reads``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from llm_budgets.conf import conf

_replica_reads: ContextVar[bool] = ContextVar("llm_budgets_replica_reads", default=False)


@contextmanager
def replica_reads() -> Iterator[str]:
    """Within the block, this app's ORM reads go to ``READ_REPLICA`` (if set). Yields the alias
    reads use."""
    token = _replica_reads.set(True)
    try:
        yield conf.READ_REPLICA or DEFAULT_DB_ALIAS
    finally:
        _replica_reads.reset(token)


class ReplicaRouter:
    """Routes this app's reads inside :func:`replica_reads` to ``LLM_BUDGETS["READ_REPLICA"]``;
    everything else (and every write) to the default database."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        if model._meta.app_label != "llm_budgets" or not _replica_reads.get():
            return None
        alias = conf.READ_REPLICA
        if alias is None or connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return None
        return alias

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # A row read from the replica is the primary's row: it may be related to primary rows.
        pair = {obj1._state.db, obj2._state.db}
        replica = conf.READ_REPLICA
        if replica is not None and pair <= {DEFAULT_DB_ALIAS, replica}:
            return True
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == "llm_budgets" and db == conf.READ_REPLICA:
            return False  # a replica follows the primary's schema; never migrate it directly
        return None
