"""Hot-path statements: SQL text written once, values prepared and converted by the models' own
fields.

Admission and commit run about a dozen statements per call, some of them while every other call
under the same budgets waits for the counter locks. The ORM compiles each query from scratch,
which costs about ten times the CPU of sending it and reading the answer (docs/performance.md).
These helpers keep what matters of the ORM, each field's own preparation of parameters and
conversion of results, so values stay exact and the same on PostgreSQL and SQLite, and skip
the compilation. Only the admission and settlement path, and the REST API's per-request reads
(authentication, throttle, the commit's tenant check), use them; everything else uses the ORM.

Rows are written without model ``save()``, so without Django's model signals (the app connects
none; hosts have ``llm_budgets.signals``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar, cast
from uuid import UUID

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields import AutoFieldMixin

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, Any], Any]
Statement = tuple[str, list[Any]]  # SQL text with %s placeholders, and its parameters


def _db() -> BaseDatabaseWrapper:
    """The default database's wrapper for this thread: looked up once per statement rather
    than on every attribute access, as ``django.db.connection`` does."""
    return connections[DEFAULT_DB_ALIAS]


def quote(name: str | None) -> str:
    assert name is not None
    return _db().ops.quote_name(name)


def table(model: type[Model]) -> str:
    return quote(model._meta.db_table)


@cache
def _field(model: type[Model], name: str) -> Field[Any, Any]:
    return cast(Field, model._meta.get_field(name))


def column(model: type[Model], name: str) -> str:
    """The quoted column of field ``name`` (a foreign key by its field name, e.g. ``tenant``)."""
    return quote(_field(model, name).column)


@cache
def _fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(model._meta.concrete_fields)


def columns(model: type[Model], alias: str) -> str:
    """Every concrete column of ``model`` under ``alias``, in the order :func:`row_to` reads."""
    return ", ".join(f"{alias}.{quote(f.column)}" for f in _fields(model))


def width(model: type[Model]) -> int:
    return len(_fields(model))


@cache
def _converters(
    model: type[Model], vendor: str
) -> tuple[tuple[int, Any, tuple[Converter, ...]], ...]:
    """Per column, what the ORM would apply to a value read from this database (e.g. text to
    Decimal and datetime on SQLite, JSON text to Python on PostgreSQL)."""
    result = []
    db = _db()
    for index, field in enumerate(_fields(model)):
        col = field.get_col(model._meta.db_table)
        found = tuple(db.ops.get_db_converters(col) + col.get_db_converters(db))
        if found:
            result.append((index, col, found))
    return tuple(result)


def row_to(model: type[M], row: Sequence[Any], offset: int = 0) -> M:
    """An instance of ``model`` from ``row[offset:offset + width(model)]``, as the ORM builds one
    from a query that selected :func:`columns`."""
    values = list(row[offset : offset + width(model)])
    db = _db()
    for index, col, converters in _converters(model, db.vendor):
        for convert in converters:
            values[index] = convert(values[index], col, db)
    return _loaded(model, values)


@cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in _fields(model))


def _loaded(model: type[M], values: Sequence[Any]) -> M:
    """What ``model.from_db`` builds from a full row, without ``Model.__init__``'s per-field
    descriptor calls and init signals (the app's models define no ``__init__`` and connect no
    init signals): about a tenth of a reserve and commit's client CPU went there. Loaded for the
    default database whichever connection stands in for it (``db.ledger``): the ORM's relations
    compare these aliases."""
    obj, state = _bare(model)
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    obj.__dict__.update(zip(_attnames(model), values, strict=True))
    return obj


def _bare(model: type[M]) -> tuple[M, ModelState]:
    """An instance of ``model`` with its state and no field set (:func:`_loaded`, :func:`new`)."""
    obj = model.__new__(model)
    state = ModelState()
    obj.__dict__["_state"] = state
    return obj, state


@cache
def _new_plan(model: type[Model]) -> tuple[dict[str, tuple[str, Any]], tuple[tuple[str, Any], ...]]:
    """For :func:`new`: per keyword (a field's name or attname), the attname it sets and the
    relation's field where it takes an instance; and every field's attname with its default."""
    keywords: dict[str, tuple[str, Any]] = {}
    defaults = []
    for field in _fields(model):
        relation = field if field.is_relation else None
        keywords[field.name] = (field.attname, relation)
        keywords[field.attname] = (field.attname, None)
        defaults.append((field.attname, field.get_default))
    return keywords, tuple(defaults)


def new(model: type[M], /, **values: Any) -> M:
    """An unsaved instance, as ``model(**values)`` builds one (keywords: field names, a foreign
    key's attname, or its field name with an instance, which is cached as the ORM caches it),
    without ``Model.__init__``'s per-field descriptor calls and init signals: for the rows each
    reserve and commit inserts (the app's models define no ``__init__`` and connect no init
    signals)."""
    keywords, defaults = _new_plan(model)
    obj, state = _bare(model)
    attributes = obj.__dict__
    for name, value in values.items():
        try:
            attname, relation = keywords[name]
        except KeyError:
            raise TypeError(
                f"{model.__name__}() got an unexpected keyword argument {name!r}"
            ) from None
        if relation is not None:
            if value is not None:
                state.fields_cache[name] = value
                value = getattr(value, relation.target_field.attname)
            else:
                state.fields_cache[name] = None
        attributes[attname] = value
    for attname, default in defaults:
        if attname not in attributes:
            attributes[attname] = default()
    return obj


def row_to_or_none(model: type[M], row: Sequence[Any], offset: int = 0) -> M | None:
    """:func:`row_to`, or None where a ``LEFT JOIN`` found no row (its primary key, the first
    column, is NULL)."""
    return None if row[offset] is None else row_to(model, row, offset)


def param(model: type[Model], name: str, value: object) -> object:
    """``value`` prepared as the ORM prepares it to compare with field ``name``."""
    return _field(model, name).get_db_prep_value(value, _db())


def lock_clause(*, of: Sequence[str] = (), skip_locked: bool = False) -> str:
    """``FOR UPDATE`` (of the given table aliases; ``SKIP LOCKED`` rows another transaction
    holds, with ``skip_locked``) where the database locks rows; empty on SQLite, where the
    transaction holds the database write lock from BEGIN."""
    db = _db()
    if not db.features.has_select_for_update:
        return ""
    of_aliases = tuple(of) if db.features.has_select_for_update_of else ()
    skip = skip_locked and db.features.has_select_for_update_skip_locked
    return " " + db.ops.for_update_sql(of=of_aliases, skip_locked=skip)


def _cursor() -> CursorWrapper:
    """A cursor for these statements. With psycopg 3, one that binds parameters on the server
    (Django's default cursor inlines them client-side, which cannot be prepared): the text of
    each statement stays the same from call to call, so with ``OPTIONS["prepare_threshold"]``
    set, PostgreSQL parses and plans it once per connection (docs/operations.md)."""
    db = _db()
    server_binding = _server_binding_cursor(db.vendor)
    if server_binding is None:
        return db.cursor()
    # What ``db.cursor()`` does, with the cursor class swapped.
    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors:
        return db._prepare_cursor(server_binding(db.connection))  # type: ignore[attr-defined]


@cache
def _server_binding_cursor(vendor: str) -> Any:
    if vendor != "postgresql":
        return None
    from django.db.backends.postgresql import base

    return base.ServerBindingCursor if getattr(base, "is_psycopg3", False) else None


def fetch(
    sql: str, params: Sequence[Any], *, first: Statement | None = None
) -> list[tuple[Any, ...]]:
    """The rows of ``sql``. ``first``: a statement to run before it, whose result is not needed
    (e.g. a ``set_config``); both go in one round trip where psycopg can pipeline them
    (:func:`fetch_each`), and each is still its own statement, so the first takes full effect
    before the second starts."""
    if first is not None:
        return fetch_each([first, (sql, list(params))])[1]
    with _cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@cache
def _pipelines(vendor: str) -> bool:
    """Whether the driver can pipeline statements (psycopg 3 on libpq 14 or later)."""
    if _server_binding_cursor(vendor) is None:
        return False
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


def grouped_rows(queryset: QuerySet[Any], *, keys: int) -> list[Sequence[Any]]:
    """The rows of an aggregate ``values(...).annotate(...)`` query as tuples: its first ``keys``
    columns converted as the ORM converts them (e.g. a local day, text on SQLite), the sums after
    them as the driver returns them (Decimal or int on PostgreSQL, int or float on SQLite) for
    the caller to convert once per merged group. The ORM's per-value conversion of the tenant
    pages' 10^4 rows per end user cost more than the query (docs/performance.md)."""
    compiler = queryset.query.get_compiler(using=queryset.db)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        return []
    converters = compiler.get_converters([column for column, _, _ in compiler.select[:keys]])
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[Sequence[Any]] = cursor.fetchall()
    return list(compiler.apply_converters(rows, converters)) if converters else rows


def execute(sql: str, params: Sequence[Any]) -> None:
    with _cursor() as cursor:
        cursor.execute(sql, params)


@cache
def _insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(f for f in _fields(model) if not isinstance(f, AutoFieldMixin))


def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The fields an insert of ``model`` writes (every concrete one but an auto primary key)."""
    return _insert_fields(model)


@cache
def _insert_sql(model: type[Model], rows: int) -> str:
    fields = _insert_fields(model)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    names = ", ".join(quote(f.column) for f in fields)
    return f"INSERT INTO {table(model)} ({names}) VALUES {', '.join([one] * rows)}"  # noqa: S608


# Field classes whose preparation for PostgreSQL leaves a value of the given type as it is
# (tests/test_statements.py checks it), so :func:`inserting` passes such values straight
# through. Exact classes only: a subclass may prepare differently. Not integers: Django sends
# them as psycopg's typed ints, which keep a prepared statement's parameter types.
_AS_IS_ON_POSTGRES: dict[type[Field[Any, Any]], tuple[type, ...]] = {
    models.CharField: (str,),
    models.TextField: (str,),
    models.BooleanField: (bool,),
    models.DecimalField: (Decimal,),
    models.UUIDField: (UUID,),
    models.ForeignKey: (UUID,),
}


@cache
def _insert_plan(model: type[Model], vendor: str) -> tuple[tuple[Field[Any, Any], Any], ...]:
    """Per insert field: the field, and the types its values are sent as they are (empty: the
    field prepares every value). Aware datetimes count too (``datetime``): PostgreSQL's
    preparation returns them unchanged."""
    plan = []
    for field in _insert_fields(model):
        kind: tuple[type, ...] = ()
        if vendor == "postgresql":
            if type(field) is models.DateTimeField and not (field.auto_now or field.auto_now_add):
                kind = (datetime,)
            else:
                kind = _AS_IS_ON_POSTGRES.get(type(field), ())
            if kind and type(field) is models.ForeignKey:
                target = type(field.target_field)
                if target is not models.UUIDField:  # integers go as psycopg's typed ints
                    kind = ()
        plan.append((field, kind))
    return tuple(plan)


def _prepared(field: Field[Any, Any], kind: tuple[type, ...], obj: Model, db: Any) -> Any:
    """``field``'s value of ``obj`` as the ORM prepares it for an insert."""
    if kind:
        value = obj.__dict__[field.attname]
        if value is None or (
            type(value) in kind and (type(value) is not datetime or value.tzinfo is not None)
        ):
            return value
    return field.get_db_prep_save(field.pre_save(obj, True), db)


def inserting(objs: Sequence[Model]) -> Statement:
    """The statement inserting new rows of one model, for :func:`run`; the objects count as
    saved from here on (the caller runs it in the same transaction). Database-generated primary
    keys are not read back: callers insert rows they do not reuse, or give the key (a UUID)."""
    model = type(objs[0])
    db = _db()
    plan = _insert_plan(model, db.vendor)
    params = [_prepared(field, kind, obj, db) for obj in objs for field, kind in plan]
    for obj in objs:
        obj._state.adding = False
        obj._state.db = DEFAULT_DB_ALIAS
    return _insert_sql(model, len(objs)), params


def updating(obj: Model, fields: Sequence[str]) -> Statement:
    """The statement storing the named fields of one row, by primary key, for :func:`run`."""
    model = type(obj)
    targets = [_field(model, name) for name in fields]
    sets = ", ".join(f"{quote(f.column)} = %s" for f in targets)
    pk = model._meta.pk
    assert pk is not None
    db = _db()
    params = [f.get_db_prep_save(f.pre_save(obj, False), db) for f in targets]
    params.append(pk.get_db_prep_value(obj.pk, db))
    return f"UPDATE {table(model)} SET {sets} WHERE {quote(pk.column)} = %s", params  # noqa: S608


def run(statements: Sequence[Statement]) -> None:
    """Run writes that return nothing, in order. On PostgreSQL in one round trip: all but the
    last become data-modifying ``WITH`` clauses of the last. They then share one snapshot, so no
    two may touch the same row (each transition writes distinct rows: its reservation, its
    ledger line or holds, its counters)."""
    if _db().vendor != "postgresql" or len(statements) < 2:
        for text, params in statements:
            execute(text, params)
        return
    execute(*_joined(statements))


def _joined(statements: Sequence[Statement]) -> Statement:
    """One statement of writes (PostgreSQL): all but the last as data-modifying ``WITH`` clauses
    of the last."""
    *first, (last, last_params) = statements
    if not first:
        return last, last_params
    clauses = ", ".join(f"w{i} AS ({text})" for i, (text, _) in enumerate(first))
    params: list[Any] = []
    for _, each in first:
        params += each
    params += last_params
    return f"WITH {clauses} {last}", params


def fetch_each(statements: Sequence[Statement]) -> list[list[tuple[Any, ...]]]:
    """The rows of each statement, run in order: in one round trip where psycopg can pipeline
    them, each still its own statement (a later one starts only once the one before it has
    finished, its locks taken, and reads a snapshot of its own)."""
    db = _db()
    if len(statements) < 2 or not _pipelines(db.vendor):
        return [fetch(text, params) for text, params in statements]
    cursors = [_cursor() for _ in statements]
    try:
        # Errors surface when the pipeline syncs, on leaving the block: translate them too.
        with db.wrap_database_errors, db.connection.pipeline():
            for cursor, (text, params) in zip(cursors, statements, strict=True):
                cursor.execute(text, params)
        return [cursor.fetchall() if _returned_rows(cursor) else [] for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()


_TUPLES_OK = 2  # libpq's PGRES_TUPLES_OK (psycopg.pq.ExecStatus.TUPLES_OK)


def _returned_rows(cursor: CursorWrapper) -> bool:
    """Whether a pipelined statement returned rows rather than a command status, read from
    psycopg's result: ``cursor.description`` would build a ``Column`` per column on every call
    (about 6% of a reserve and commit's client CPU went there)."""
    result = cursor.cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


def run_committing(statements: Sequence[Statement]) -> None:
    """:func:`run` as the last writes of the transaction, committing it in the same round trip
    where psycopg pipelines (the COMMIT queued behind the writes). Only when the innermost
    ``atomic()`` block is also the outermost (the caller's own transaction, not nested in a host's
    or a test's): otherwise just :func:`run`, and the block's exit commits as usual. The caller
    runs nothing more in the block (it would start a new transaction); the block's exit then
    finds the transaction committed and has nothing to send. A failed write or COMMIT raises here,
    and nothing is committed."""
    db = _db()
    if not statements or not _pipelines(db.vendor) or not _own_transaction(db):
        run(statements)
        return
    with _cursor() as cursor, db.wrap_database_errors, db.connection.pipeline():
        cursor.execute(*_joined(statements))
        # COMMIT as a statement of the batch, not ``connection.commit()``: that sends a Sync of
        # its own, and leaving the pipeline another, two round trips where one will do.
        cursor.execute("COMMIT")


def commit_unwritten() -> bool:
    """End the caller's own transaction, which wrote nothing (it only read and locked rows), with
    a COMMIT rather than a rollback, in one round trip; returns whether it did. The effect is
    the same (no change, locks released), but psycopg 3 answers any ROLLBACK by forgetting every
    prepared statement of the connection (and sends DEALLOCATE ALL): each statement is then
    parsed and planned again, five times, before it is prepared anew. Under contention, where
    admission leaves many attempts (busy stripes, refusals), that planning was most of
    PostgreSQL's CPU. The COMMIT does not wait for the WAL flush (``synchronous_commit`` off for
    this transaction): its row locks need not be durable. False, and nothing sent, where it
    cannot pipeline or the transaction is not the caller's own: the caller rolls back."""
    db = _db()
    if not _pipelines(db.vendor) or not _own_transaction(db):
        return False
    run_committing([("SELECT set_config('synchronous_commit', 'off', true)", [])])
    return True


def _own_transaction(db: BaseDatabaseWrapper) -> bool:
    """Whether one ``atomic()`` block is open, the outermost, with nothing marked to roll back."""
    return (
        db.in_atomic_block
        and len(db.atomic_blocks) == 1
        and not db.savepoint_ids
        and db.commit_on_exit
        and not db.needs_rollback
    )
