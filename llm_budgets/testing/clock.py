"""Moving time in a host's tests.

Admission reads the database's clock (``llm_budgets.db.dbclock``), which ``freezegun`` and
``time_machine`` cannot move: a test that travels to the next month would still be charged to
this one. Inside :func:`application_clock` admission reads ``django.utils.timezone.now()``
instead, which both libraries move. Tests only: nothing in the app turns it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llm_budgets.db.dbclock import following_application_clock


@contextmanager
def application_clock() -> Iterator[None]:
    """Within the block, admission (windows, resets, hold expiry) follows this process's clock."""
    with following_application_clock():
        yield
