"""Counting the database round trips of a block of code: what a call costs on a network, where
``assertNumQueries`` counts statements, and the app sends some of its statements together."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections


@contextmanager
def round_trips() -> Iterator[list[list[str]]]:
    """The statements sent inside the block, grouped by round trip, on the default connection and
    on the ledger's own (``db.ledger``: money movements commit there outside a test's
    transaction): statements psycopg sends in one pipeline (the app's
    ``db.statements.fetch_each``) form one group, any other statement its own. Savepoints (a
    test's transaction stands in for BEGIN and COMMIT) are left out."""
    from llm_budgets.db.ledger import ledger_db

    trips: list[list[str]] = []
    watched = [connection]
    ledger = ledger_db()
    if ledger is not connections[DEFAULT_DB_ALIAS]:
        watched.append(ledger)
    last: dict[str, object] = {}

    def recorder(wrapper: Any) -> Any:
        def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if "SAVEPOINT" not in sql:
                pipeline = getattr(wrapper.connection, "_pipeline", None)
                if pipeline is not None and pipeline is last.get(wrapper.alias):
                    trips[-1].append(sql)
                else:
                    trips.append([sql])
                last[wrapper.alias] = pipeline
            return execute(sql, params, many, context)

        return record

    with ExitStack() as stack:
        for wrapper in watched:
            stack.enter_context(wrapper.execute_wrapper(recorder(wrapper)))
        yield trips
