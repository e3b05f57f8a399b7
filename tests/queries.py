"""Reading captured SQL without depending on how the backend quotes names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.db.models import Model


def reads(sql: str | None, model: type[Model]) -> bool:
    """Whether ``sql`` reads or writes ``model``'s table (after FROM, JOIN, INTO or UPDATE), named
    as this connection quotes it."""
    table = re.escape(connection.ops.quote_name(model._meta.db_table))
    return re.search(rf"\b(FROM|JOIN|INTO|UPDATE)\s+{table}(\s|$|\))", sql or "") is not None


@contextmanager
def round_trips() -> Iterator[list[list[str]]]:
    """The statements sent inside the block, grouped by round trip: statements psycopg sends in
    one pipeline (``statements.fetch_each``) form one group, any other statement its own.
    Savepoints (the test's transaction stands in for BEGIN and COMMIT) are left out."""
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
