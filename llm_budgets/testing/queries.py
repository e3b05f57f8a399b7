"""Counting the database round trips of a block of code: what a call costs on a network, where
``assertNumQueries`` counts statements, and the app sends some of its statements together."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection


@contextmanager
def round_trips() -> Iterator[list[list[str]]]:
    """The statements sent inside the block on the default connection, grouped by round trip:
    statements psycopg sends in one pipeline (the app's ``db.statements.fetch_each``) form one
    group, any other statement its own. Savepoints (a test's transaction stands in for BEGIN and
    COMMIT) are left out."""
    trips: list[list[str]] = []
    last: list[object] = [None]

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SAVEPOINT" not in sql:
            pipeline = getattr(connection.connection, "_pipeline", None)
            if pipeline is not None and pipeline is last[0]:
                trips[-1].append(sql)
            else:
                trips.append([sql])
            last[0] = pipeline
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield trips
