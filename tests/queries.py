"""Reading captured SQL without depending on how the backend quotes names (the round trips of a
block: ``llm_budgets.testing.queries``)."""

from __future__ import annotations

import re

from django.db import connection
from django.db.models import Model


def reads(sql: str | None, model: type[Model]) -> bool:
    """Whether ``sql`` reads or writes ``model``'s table (after FROM, JOIN, INTO or UPDATE), named
    as this connection quotes it."""
    table = re.escape(connection.ops.quote_name(model._meta.db_table))
    return re.search(rf"\b(FROM|JOIN|INTO|UPDATE)\s+{table}(\s|$|\))", sql or "") is not None
