"""Counters by key: the one definition of which counter row a budget draws on, and the reads
and locks of counter rows by that key.

A counter is identified by its :class:`CounterKey`: the budget, each dimension that splits a
budget's counter (the end user, run or API key of an each-end-user, each-run or each-key ``"*"``
budget; NULL where the budget is not split by it) and the period start. Every lookup of
counters by key, whether SQL text (:func:`counters_locked`) or ORM filter
(:func:`counters_matching`, :func:`rolling_buckets`), and every key built from a row
(:meth:`CounterKey.of`), is derived from ``DIMENSIONS`` below:
a new dimension (an API key, a run, a tag) is one field of ``CounterKey``, one entry in
``DIMENSIONS`` and its column on ``Counter`` (with its unique constraint).
``tests/test_rule_parity.py`` fails if another module spells a counter lookup of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Q

from llm_budgets.db import statements as sql
from llm_budgets.engine.types import DIMENSIONS, ApplicableBudget, CounterKey
from llm_budgets.models import Counter
from llm_budgets.money import ZERO
from llm_budgets.windows import rolling_window


def _dimensions_q(key: CounterKey) -> dict[str, object]:
    lookups: dict[str, object] = {"budget_id": key.budget_id}
    for name, value in zip(DIMENSIONS, key[1:-1], strict=True):
        if value is None:
            lookups[f"{name}__isnull"] = True
        else:
            lookups[f"{name}_id"] = value
    return lookups


def key_q(key: CounterKey, *, since: datetime | None = None) -> Q:
    """An ORM filter for the row of ``key`` or, with ``since``, its series' rows from ``since``
    on (a rolling budget's buckets)."""
    if since is None:
        return Q(**_dimensions_q(key), period_start=key.period_start)
    return Q(**_dimensions_q(key), period_start__gte=since)


def counters_matching(applicable: Sequence[ApplicableBudget]) -> Q:
    """A filter for exactly the counter rows of ``applicable`` (never another end user's)."""
    match = Q(pk__in=[])
    for item in applicable:
        match |= key_q(item.counter_key)
    return match


def _nulls(key: CounterKey) -> tuple[bool, ...]:
    """Which of the key's dimensions are NULL: the shape its SQL condition depends on."""
    return tuple(value is None for value in key[1:-1])


def _key_condition(nulls: tuple[bool, ...], alias: str) -> str:
    """The SQL form of ``key_q`` for a key of this shape, on counter alias ``alias``; its
    parameters are ``_key_params(key)``."""
    conditions = [f"{alias}.{sql.column(Counter, 'budget')} = %s"]
    for name, null in zip(DIMENSIONS, nulls, strict=True):
        test = "IS NULL" if null else "= %s"
        conditions.append(f"{alias}.{sql.column(Counter, name)} {test}")
    conditions.append(f"{alias}.{sql.column(Counter, 'period_start')} = %s")
    return f"({' AND '.join(conditions)})"


def _key_params(key: CounterKey) -> list[object]:
    dimensions = [value for value in key[1:-1] if value is not None]
    return [key.budget_id, *dimensions, sql.param(Counter, "period_start", key.period_start)]


def rows_by_key(counters: Sequence[Counter]) -> dict[CounterKey, list[Counter]]:
    """Counter rows grouped by key: a hot budget's key has a row per stripe, others one."""
    grouped: dict[CounterKey, list[Counter]] = {}
    for counter in counters:
        grouped.setdefault(CounterKey.of(counter), []).append(counter)
    return grouped


def counter_totals(counters: Sequence[Counter]) -> dict[CounterKey, tuple[Decimal, Decimal]]:
    """``(spent, reserved)`` of each key, summed over its stripes in exact ``Decimal``: the
    cap as one number, whatever it is split into."""
    totals: dict[CounterKey, tuple[Decimal, Decimal]] = {}
    for key, rows in rows_by_key(counters).items():
        totals[key] = (sum((c.spent for c in rows), ZERO), sum((c.reserved for c in rows), ZERO))
    return totals


def counters_locked(
    applicable: Sequence[ApplicableBudget], *, first: sql.Statement | None = None
) -> list[Counter]:
    """Lock exactly the counter rows of ``applicable``, every stripe of a hot budget's
    (``FOR UPDATE``, in primary-key order, so concurrent admissions cannot deadlock: the
    canonical lock order) and return them; a missing row is simply absent.
    One statement without the ORM's compilation (see ``llm_budgets.db.statements``), sent with
    ``first`` if given (``statements.fetch``)."""
    return counters_from(sql.fetch(*counters_locking(applicable), first=first))


def counters_locking(
    applicable: Sequence[ApplicableBudget], stripe_ids: Sequence[int] = ()
) -> sql.Statement:
    """The statement :func:`counters_locked` runs (its rows: :func:`counters_from`), to send
    with others in one round trip (``statements.fetch_each``). ``stripe_ids``: stripes to lock
    with them, each by its id (admission's waiting path), in the same pk order."""
    keys = [item.counter_key for item in applicable]
    params = [param for key in keys for param in _key_params(key)]
    return _counters_locked_sql(tuple(_nulls(k) for k in keys), len(stripe_ids)), [
        *params,
        *stripe_ids,
    ]


def counters_from(rows: Sequence[Sequence[Any]]) -> list[Counter]:
    """Counters from the rows of :func:`counters_locking` or :func:`stripes_picking`."""
    return [sql.row_to(Counter, row) for row in rows]


@functools.cache
def _counters_locked_sql(shapes: tuple[tuple[bool, ...], ...], stripes: int = 0) -> str:
    conditions = [_key_condition(nulls, "c") for nulls in shapes]
    if stripes:
        conditions.append(f"c.id IN ({', '.join(['%s'] * stripes)})")
    match = " OR ".join(conditions)
    return (
        f"SELECT {sql.columns(Counter, 'c')} FROM {sql.table(Counter)} c"  # noqa: S608
        f" WHERE {match or 'FALSE'} ORDER BY c.id{sql.lock_clause()}"
    )


def stripes_picking(picks: Sequence[tuple[ApplicableBudget, Decimal]]) -> sql.Statement:
    """For each ``(hot budget, amount)``: lock one of its stripes that can take ``amount`` within
    its allowance, split for the budget's current effective limit, skipping stripes another
    transaction holds (``FOR UPDATE SKIP LOCKED``). One statement. Its rows
    (:func:`picked_from`) end with a flag: true for a stripe it locked; false for a stripe
    with room that it could not lock because every such stripe was busy (not locked: the one
    admission's waiting path waits for); no row for a budget none of whose stripes has room.
    Sent after another locking statement in one round trip (``statements.fetch_each``), it
    starts only once that one holds its locks."""
    with_room: list[object] = []
    for item, amount in picks:
        with_room += [
            *_key_params(item.counter_key),
            sql.param(Counter, "split_for", item.limit),
            sql.param(Counter, "allowance", amount),
        ]
    params = with_room * 2  # the picks, then the busy stripes' candidates: the same conditions
    shapes = tuple(_nulls(item.counter_key) for item, _ in picks)
    return _stripes_picked_sql(shapes), params


def picked_from(rows: Sequence[Sequence[Any]]) -> tuple[list[Counter], list[Counter]]:
    """The rows of :func:`stripes_picking`: the stripes it locked, and the busy ones with room."""
    locked: list[Counter] = []
    busy: list[Counter] = []
    for row in rows:
        (locked if row[-1] else busy).append(sql.row_to(Counter, row))
    return locked, busy


@functools.cache
def _stripes_picked_sql(shapes: tuple[tuple[bool, ...], ...]) -> str:
    spent, reserved = sql.column(Counter, "spent"), sql.column(Counter, "reserved")
    allowance, split_for = sql.column(Counter, "allowance"), sql.column(Counter, "split_for")

    def with_room(nulls: tuple[bool, ...]) -> str:
        return (
            f"{_key_condition(nulls, 'c')} AND c.{split_for} = %s"
            f" AND c.{spent} + c.{reserved} + %s <= c.{allowance}"
        )

    table = sql.table(Counter)
    picks = [
        f"p{i} AS (SELECT {sql.columns(Counter, 'c')} FROM {table} c"  # noqa: S608
        f" WHERE {with_room(nulls)}"
        f" ORDER BY random() LIMIT 1{sql.lock_clause(skip_locked=True)})"
        for i, nulls in enumerate(shapes)
    ]
    taken = [f"SELECT p{i}.*, 1 FROM p{i}" for i in range(len(shapes))]  # noqa: S608
    # Only where the pick found none free: a stripe with room as this statement's snapshot saw
    # it, not locked (every one was busy).
    busy = [
        f"SELECT * FROM (SELECT {sql.columns(Counter, 'c')}, 0 FROM {table} c"  # noqa: S608
        f" WHERE NOT EXISTS (SELECT 1 FROM p{i}) AND {with_room(nulls)}"
        f" ORDER BY random() LIMIT 1) b{i}"
        for i, nulls in enumerate(shapes)
    ]
    return f"WITH {', '.join(picks)} {' UNION ALL '.join(taken + busy)}"


@dataclass(frozen=True)
class Bucket:
    start: datetime
    spent: Decimal
    reserved: Decimal


def rolling_buckets(
    applicable: Sequence[ApplicableBudget],
) -> dict[CounterKey, list[Bucket]]:
    """The buckets each rolling budget counts in the window ending with its current bucket
    (``item.period``), and any newer ones (e.g. from a clock ahead of this one), oldest first,
    keyed by ``counter_key`` (an each-end-user budget counts only that end user's buckets). One
    query, at most a window of buckets per budget; callers sum in ``Decimal`` (SQLite sums
    decimals as floats). Inside admission's transaction these rows are covered by the budget
    row's lock, not locked themselves."""
    windows = [
        (item, window)
        for item in applicable
        if (window := rolling_window(item.budget.window)) is not None
    ]
    result: dict[CounterKey, list[Bucket]] = {item.counter_key: [] for item, _ in windows}
    if not windows:
        return result
    condition = Q(pk__in=[])
    keys = {}
    for item, window in windows:
        key = item.counter_key
        condition |= key_q(key, since=window.counted_from(item.period.start))
        keys[key.series] = key
    order = ["budget_id", *(f"{d}_id" for d in DIMENSIONS), "period_start"]
    rows = Counter.objects.filter(condition).order_by(*order)
    for counter in rows:
        bucket = CounterKey.of(counter)
        result[keys[bucket.series]].append(
            Bucket(bucket.period_start, counter.spent, counter.reserved)
        )
    return result
