"""The database's clock: the reference for the times that decide what a call may spend.

Every web and worker process has its own clock, and one that is minutes off would, if admission
read it, charge a call to a period that has ended (widening the window) or open the next period
early (resetting the budget twice), and give its holds an ``expires_at`` minutes off. Admission
therefore reads the time from the one clock every process shares, the database's, in the same
statement as its context (``engine.applicable.admission_context``): no extra round trip.

- PostgreSQL: ``statement_timestamp()`` (the start of the statement; constant within it).
- SQLite: SQLite's own ``'now'`` (the operating system's clock read by SQLite's C code, to the
  millisecond, rounded up; the database file is shared only by processes on one machine).

An explicit ``now=`` (the state machine, tests, replays) is used as given. Tests that move the
application's clock (``time_machine``) and expect admission to follow it say so with
:func:`following_application_clock`; nothing in the app turns it on, and there is no setting
for it: a production process never falls back to its own clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone

from llm_budgets.db import statements as sql

_follow_application_clock = False


@contextmanager
def following_application_clock() -> Iterator[None]:
    """Within the block, admission reads this process's clock (``timezone.now()``) instead of
    the database's. For tests that move time with ``time_machine``; never used by the app."""
    global _follow_application_clock
    saved, _follow_application_clock = _follow_application_clock, True
    try:
        yield
    finally:
        _follow_application_clock = saved


def given_or_none(now: datetime | None) -> datetime | None:
    """The time a caller fixed: ``now`` if given, the application's clock inside
    :func:`following_application_clock`, else None (read the database's clock)."""
    if now is not None:
        return now
    return timezone.now() if _follow_application_clock else None


def now_sql() -> str:
    """An SQL expression for the database's clock, to use where a time parameter would go.
    Its ``%`` are doubled: the statement is sent with parameters."""
    if connection.vendor == "postgresql":
        return "statement_timestamp()"
    # SQLite's 'now' is truncated to the millisecond: rounded up, it is never before a time
    # this machine's processes wrote just before (a price, a raise, a kill switch).
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+0.001 seconds')"


def from_value(value: object) -> datetime:
    """A value :func:`now_sql` selected, as an aware datetime (UTC)."""
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS', UTC
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    raise TypeError(f"not a time from the database's clock: {value!r}")


def database_now() -> datetime:
    """The database's clock, in a statement of its own (for paths that have no context read to
    carry it)."""
    rows = sql.fetch(f"SELECT {now_sql()}", [])
    return from_value(rows[0][0])


def now_for(now: datetime | None) -> datetime:
    """``given_or_none(now)``, or the database's clock read now (its own statement)."""
    return given_or_none(now) or database_now()
