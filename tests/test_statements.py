"""The hot-path statements (``db.statements``): rows read back exactly as the ORM reads
them, the statement count of a call, and prepared statements on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from django.db import connection, models
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.db import statements as sql
from llm_budgets.db.ledger import ledger_db
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    Counter,
    EndUser,
    KillSwitch,
    Plan,
    Price,
    Reservation,
    Run,
    Tenant,
    UsageRecord,
)
from llm_budgets.testing.queries import round_trips
from tests.concurrency import outside_connection
from tests.queries import reads

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> None:
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
        cached_input_per_mtok=Decimal("1.25"),
    )
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Amsterdam")
    budgets.set_limit(amount=Decimal("5000"), window="month")
    budgets.set_limit(tenant="acme", amount=Decimal("100"), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("5"), window="day")


def _call(**reserve: object) -> Reservation:
    hold = budgets.reserve(
        tenant="acme",
        end_user="u-1",
        provider="openai",
        model="gpt-4o",
        input_tokens=1234,
        max_output_tokens=567,
        **reserve,  # type: ignore[arg-type]
    )
    hold.commit(input_tokens=1111, output_tokens=321, cached_input_tokens=100)
    return hold.reservation  # type: ignore[no-any-return]


def _read_back(model: type[Model], pk: object) -> Model:
    table = sql.table(model)
    rows = sql.fetch(
        f"SELECT {sql.columns(model, 'x')} FROM {table} x WHERE x.id = %s",
        [sql.param(model, "id", pk)],
    )
    return sql.row_to(model, rows[0])


@pytest.mark.parametrize("model", [Reservation, UsageRecord, Price, Counter])
def test_rows_read_back_as_the_orm_reads_them(acme: None, model: type[Model]) -> None:
    """Decimals to the last place, datetimes with their zone, JSON and UUIDs: field by field."""
    reservation = _call(tags={"feature": "search"})
    pk = {
        Reservation: reservation.pk,
        UsageRecord: UsageRecord.objects.get(reservation=reservation).pk,
        Price: reservation.price_id,
        Counter: Counter.objects.order_by("pk").last().pk,  # type: ignore[union-attr]
    }[model]
    by_orm = model._default_manager.get(pk=pk)
    by_statement = _read_back(model, pk)
    for field in model._meta.concrete_fields:
        ours, theirs = getattr(by_statement, field.attname), getattr(by_orm, field.attname)
        assert (ours, type(ours)) == (theirs, type(theirs)), field.name
    assert not by_statement._state.adding


def test_a_known_end_users_call_runs_five_statements(acme: None, on_postgres: bool) -> None:
    """The statement budget of the hot path (docs/performance.md): a regression shows here
    before it shows in the bench. Inside the test's transaction each transaction of the call
    is a savepoint pair and a lock-timeout statement (PostgreSQL) around its own statements."""
    _call()  # the end user's first call creates it and its counters
    with CaptureQueriesContext(connection) as reserve_queries:
        hold = budgets.reserve(
            tenant="acme",
            end_user="u-1",
            provider="openai",
            model="gpt-4o",
            input_tokens=10,
            max_output_tokens=10,
        )
    with CaptureQueriesContext(connection) as commit_queries:
        hold.commit(input_tokens=10, output_tokens=10)
    own = [
        q["sql"]
        for q in (*reserve_queries.captured_queries, *commit_queries.captured_queries)
        if "SAVEPOINT" not in (q["sql"] or "")
        and not (q["sql"] or "").startswith("SELECT set_config")
    ]
    # PostgreSQL: reserve reads the context (no kill switch is open, so none can cover the
    # call) and the locked counters, then writes once; commit locks the reservation, then one
    # write also locks and updates the counters. SQLite runs each write on its own.
    expected = 5 if on_postgres else 10
    assert len(own) == expected, "\n".join(own)
    assert counters_drift() == []


def test_an_end_users_first_call_reads_the_end_user_once(acme: None) -> None:
    """The first sight falls back to reading the tenant alone, not the same join again."""
    with CaptureQueriesContext(connection) as queries:
        budgets.reserve(
            tenant="acme",
            end_user="new-user",
            provider="openai",
            model="gpt-4o",
            input_tokens=10,
            max_output_tokens=10,
        )
    joins = [  # the end user joined with its tenant (and plan): the admission context's read
        q for q in queries.captured_queries if reads(q["sql"], EndUser) and reads(q["sql"], Tenant)
    ]
    assert len(joins) == 1, [q["sql"] for q in queries.captured_queries]


def test_prepared_statements_on_postgresql(acme: None, on_postgres: bool) -> None:
    """With psycopg's prepare_threshold set (a host setting), the statements are prepared on
    the server: parameters must bind there with the types PostgreSQL infers."""
    if not on_postgres:
        pytest.skip("prepared statements are a PostgreSQL feature")
    with _prepared_at_once():
        results = [_call() for _ in range(3)]
        prepared = _prepared()
    assert prepared >= 6
    assert {r.state for r in results} == {"committed"}
    costs = set(UsageRecord.objects.values_list("cost", flat=True))
    # (1011 uncached x 2.50 + 100 cached x 1.25 + 321 x 10.00) / 10^6
    assert costs == {Decimal("0.0058625")}
    assert counters_drift() == []


@contextmanager
def _prepared_at_once() -> Iterator[None]:
    """psycopg prepares every statement from its first execution (as a host's
    ``OPTIONS["prepare_threshold"]`` would after a few)."""
    ledger = ledger_db()
    ledger.ensure_connection()
    raw = ledger.connection
    saved = raw.prepare_threshold
    raw.prepare_threshold = 0
    try:
        yield
    finally:
        raw.prepare_threshold = saved


def _prepared() -> int:
    with ledger_db().cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_refusal_keeps_the_connections_prepared_statements(acme: None, on_postgres: bool) -> None:
    """A refused call's transaction wrote nothing: it is committed, not rolled back, because
    psycopg answers a ROLLBACK by deallocating every prepared statement of the connection (and
    every statement is then parsed and planned again). Likewise for a busy stripe's retry."""
    if not on_postgres:
        pytest.skip("prepared statements are a PostgreSQL feature")
    with _prepared_at_once():
        _call()
        before = _prepared()
        with pytest.raises(BudgetExceeded):
            budgets.reserve(
                tenant="acme",
                end_user="u-1",
                provider="openai",
                model="gpt-4o",
                input_tokens=10,
                max_output_tokens=2_000_000,  # 20 USD: past u-1's 5 a day
            )
        after = _prepared()
    assert before >= 6
    assert after >= before


def _reserve_trips(**scopes: object) -> tuple[list[list[str]], int]:
    """The round trips of one reserve, and how many counter rows it holds."""
    with round_trips() as trips:
        hold = budgets.reserve(
            tenant="acme",
            end_user="u-1",
            provider="openai",
            model="gpt-4o",
            input_tokens=10,
            max_output_tokens=10,
            **scopes,  # type: ignore[arg-type]
        )
    hold.release()
    return trips, hold.reservation.holds.count()


def test_a_run_and_a_tag_cost_no_round_trip(acme: None, on_postgres: bool) -> None:
    """Issue #16's cost: a call naming no run and no tag, a run, a tag or both pays the same
    round trips (PostgreSQL): the run and the tag's budgets join admission's one context read,
    and the run's close is read in the round trip that locks the counters, right after it. Each
    locks one more counter row, and the run no row of its own. On SQLite (no network) the
    close read is one more statement."""
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("50"), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=Decimal("50"), window="month")
    _call(run="r-1", tags={"project": "alpha"})  # creates the run and every counter
    (plain, plain_rows), (tagged, tagged_rows), (run, run_rows), (both, both_rows) = (
        _reserve_trips(**scopes)
        for scopes in (
            {},
            {"tags": {"project": "alpha"}},
            {"run": "r-1"},
            {"tags": {"project": "alpha"}, "run": "r-1"},
        )
    )
    shown = "\n\n".join(" | ".join(trip) for trip in both)
    # The context read, the lock bound with the counters' lock (and the close read), the write
    # (on SQLite each write is its own statement).
    assert len(plain) == (3 if on_postgres else 5), plain
    assert len(tagged) == len(plain), tagged
    assert len(run) == len(both) == len(plain) + (0 if on_postgres else 1), shown
    statements = [sum(len(trip) for trip in kind) for kind in (plain, tagged, run, both)]
    assert statements == [statements[0]] * 2 + [statements[0] + 1] * 2  # the close read
    assert not any(reads(sql, Run) for trip in plain + tagged for sql in trip)
    run_reads = [sql for trip in both for sql in trip if reads(sql, Run)]
    assert len(run_reads) == 2, run_reads  # joined into the context read, and the close read
    # Global, tenant, end user; + tag, or + run; + both.
    assert [plain_rows, tagged_rows, run_rows, both_rows] == [3, 4, 4, 5]
    locks = [sql for trip in both for sql in trip if "FOR UPDATE" in sql or "FOR SHARE" in sql]
    assert len(locks) == (1 if on_postgres else 0), locks  # the counters' lock, nothing else


def test_a_spread_call_locks_its_counters_and_picks_its_stripe_in_one_round_trip(
    acme: None, on_postgres: bool
) -> None:
    """Only the global cap is hot (the bench's spread shape): the lock of the other counters and
    the stripe pick are two statements, the pick after the lock (no wait while a stripe is held),
    in one round trip on PostgreSQL."""
    budgets.set_limit(amount=Decimal("5000"), window="month", hot=True, stripes=4)
    _call()  # creates the counters; the first call under the hot cap splits its stripes
    trips, rows = _reserve_trips()
    locking = [(i, sql) for i, trip in enumerate(trips) for sql in trip if "FOR UPDATE" in sql]
    if on_postgres:
        assert len(trips) == 3, trips  # context; lock bound, counters' lock, pick; write
        assert [i for i, _ in locking] == [1, 1], locking
        assert "SKIP LOCKED" in locking[1][1]
        assert "SKIP LOCKED" not in locking[0][1]
    assert rows == 3
    assert counters_drift() == []


def _outside(text: str, params: list[object]) -> list[tuple[object, ...]]:
    """Rows read on a connection of their own: what is committed, whatever this one holds."""
    with outside_connection(autocommit=True) as other:
        return list(other.execute(text, params).fetchall())


def _tenant_row(external_id: str) -> sql.Statement:
    return sql.inserting([Tenant(external_id=external_id, name=external_id)])


@pytest.mark.django_db(transaction=True)
def test_run_committing_commits_the_engines_own_transaction_with_its_last_write(
    on_postgres: bool,
) -> None:
    """Committed before the block's exit (the COMMIT went with the write); nested in a caller's
    transaction it only writes, and the caller's block decides."""
    from django.db import transaction

    if not on_postgres:
        pytest.skip("the commit rides a psycopg pipeline: PostgreSQL only")
    table = sql.table(Tenant)
    seen = f"SELECT count(*) FROM {table} WHERE external_id = %s"
    with transaction.atomic():
        sql.run_committing([_tenant_row("own")])
        assert _outside(seen, ["own"]) == [(1,)]
    with transaction.atomic(), transaction.atomic():
        sql.run_committing([_tenant_row("nested")])
        assert _outside(seen, ["nested"]) == [(0,)]
    assert _outside(seen, ["nested"]) == [(1,)]
    with transaction.atomic():
        sql.run_committing([_tenant_row("a"), _tenant_row("b")])  # one statement, one commit
    assert Tenant.objects.filter(external_id__in=["a", "b"]).count() == 2


@pytest.mark.django_db(transaction=True)
def test_run_committing_sends_the_write_and_the_commit_in_one_round_trip(
    on_postgres: bool, tmp_path: Path
) -> None:
    """What goes over the wire, read from libpq's trace of the connection: from the last write
    to the block's exit, one Sync (the write and COMMIT go together, the client waits for the
    server once, and the exit sends nothing). ``connection.commit()`` inside the pipeline sent a
    Sync of its own, then leaving the pipeline another: two round trips."""
    from django.db import transaction

    if not on_postgres:
        pytest.skip("the commit rides a psycopg pipeline: PostgreSQL only")
    trace = tmp_path / "libpq.trace"
    with trace.open("w") as sink:
        connection.ensure_connection()
        pgconn = connection.connection.pgconn
        try:
            with transaction.atomic():
                Tenant.objects.exists()  # the transaction's first statement (BEGIN goes with it)
                pgconn.trace(sink.fileno())
                sql.run_committing([_tenant_row("traced")])
        finally:
            pgconn.untrace()
    sent = [line.split("\t") for line in trace.read_text().splitlines()]
    syncs = [fields for fields in sent if len(fields) > 3 and fields[1:4:2] == ["F", "Sync"]]
    assert len(syncs) == 1, trace.read_text()
    seen = f"SELECT count(*) FROM {sql.table(Tenant)} WHERE external_id = %s"
    assert _outside(seen, ["traced"]) == [(1,)]


@pytest.mark.django_db(transaction=True)
def test_run_committing_a_commit_that_fails_raises_and_writes_nothing(on_postgres: bool) -> None:
    """A foreign key is checked at COMMIT (Django's are deferred): the violation surfaces from
    the write's round trip, nothing is written, and the connection works afterwards."""
    from django.db import IntegrityError, transaction

    if not on_postgres:
        pytest.skip("the commit rides a psycopg pipeline: PostgreSQL only")
    orphan = sql.inserting([EndUser(tenant_id=987654321, external_id="orphan")])
    with pytest.raises(IntegrityError), transaction.atomic():
        sql.run_committing([_tenant_row("with-orphan"), orphan])
    assert not Tenant.objects.filter(external_id="with-orphan").exists()
    assert not EndUser.objects.filter(external_id="orphan").exists()
    with transaction.atomic():
        sql.run_committing([_tenant_row("after")])
    assert Tenant.objects.filter(external_id="after").exists()


def test_an_open_switch_elsewhere_costs_the_call_no_extra_round_trip_for_the_bound(
    acme: None, on_postgres: bool
) -> None:
    """Some switch is open (another tenant's), so the call reads which switches cover it: that
    read is the transaction's first statement and goes with the bound on lock waits."""
    budgets.ensure_tenant(tenant="other")
    budgets.trip(tenant="other", reason="runaway agent")
    _call()
    trips, _ = _reserve_trips()
    switch_reads = [trip for trip in trips if any(reads(sql, KillSwitch) for sql in trip)]
    bound = [trip for trip in trips if any(sql.startswith("SELECT set_config") for sql in trip)]
    if on_postgres:
        # The context read (which sees that a switch is open), the bound with the switch read,
        # the counters' lock, the write.
        assert len(trips) == 4, trips
        assert bound == switch_reads[-1:], trips
        assert len(bound[0]) == 2, bound


def test_a_call_without_an_end_user_reads_its_tenant_in_one_statement(acme: None) -> None:
    with CaptureQueriesContext(connection) as queries:
        budgets.reserve(
            tenant="acme", provider="openai", model="gpt-4o", input_tokens=10, max_output_tokens=10
        )
    tenant_reads = [q["sql"] for q in queries.captured_queries if reads(q["sql"], Tenant)]
    assert len(tenant_reads) == 1, tenant_reads
    assert reads(tenant_reads[0], Plan)


@pytest.mark.django_db(transaction=True)
def test_nothing_runs_in_the_engines_transaction_after_its_commit(
    acme: None, on_postgres: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_committing`` commits before the engine's ``atomic()`` block exits, so the block
    must run nothing more: a statement there would start a second transaction, no longer atomic
    with the first, which the block's exit would then commit. Watched over reserve, commit,
    release and settling an uncertain hold: every statement between a COMMIT and the outermost
    block's exit is a failure."""
    from django.db import transaction

    if not on_postgres:
        pytest.skip("the commit rides a psycopg pipeline: PostgreSQL only")
    state = {"committed": False, "commits": 0}
    late: list[str] = []
    exit_block = transaction.Atomic.__exit__

    def exiting(self: transaction.Atomic, *exc: object) -> None:
        if len(connection.atomic_blocks) == 1:  # the outermost block: its transaction ends
            state["committed"] = False
        exit_block(self, *exc)  # type: ignore[arg-type]

    def watch(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
        if state["committed"]:
            late.append(text)
        result = execute(text, params, many, context)
        if text == "COMMIT" and connection.in_atomic_block:
            state["committed"], state["commits"] = True, state["commits"] + 1
        return result

    monkeypatch.setattr(transaction.Atomic, "__exit__", exiting)
    with ledger_db().execute_wrapper(watch):
        call = {"provider": "openai", "model": "gpt-4o", "input_tokens": 100}
        budgets.reserve(tenant="acme", end_user="u1", **call, max_output_tokens=100).commit(
            input_tokens=100, output_tokens=50
        )
        budgets.reserve(tenant="acme", end_user="u1", **call, max_output_tokens=100).release()
        uncertain = budgets.reserve(tenant="acme", end_user="u1", **call, max_output_tokens=100)
        uncertain.mark_uncertain()
        uncertain.commit(input_tokens=100, output_tokens=10)
    assert late == []
    assert state["commits"] >= 5  # each reserve, commit and release committed in its batch


@pytest.mark.parametrize("model", [Reservation, UsageRecord])
def test_new_builds_what_the_models_constructor_builds(acme: None, model: type[Model]) -> None:
    """``sql.new`` stands in for ``Model(**values)`` on the hot path: the same attributes (the
    defaults filled in, a relation given as an instance stored by its key and cached), unsaved."""
    reservation = _call()
    tenant = Tenant.objects.get(external_id="acme")
    values: dict[str, Any] = {
        Reservation: {"tenant": tenant, "end_user": None, "model": "gpt-4o", "tags": {"a": "b"}},
        UsageRecord: {"tenant_id": tenant.pk, "reservation": reservation, "cost": Decimal("1.5")},
    }[model]
    ours, theirs = sql.new(model, **values), model(**values)
    varying = {"id", "created_at"}  # defaults drawn per instance (a UUID, the clock)
    for field in model._meta.concrete_fields:
        if field.name in varying:
            assert type(getattr(ours, field.attname)) is type(getattr(theirs, field.attname))
            continue
        assert getattr(ours, field.attname) == getattr(theirs, field.attname), field.name
    for name, value in values.items():
        assert getattr(ours, name) is value or getattr(ours, name) == value
    assert ours._state.adding
    assert ours._state.db is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        sql.new(model, colour="red")


def test_values_sent_as_they_are_are_what_the_fields_would_send(
    acme: None, on_postgres: bool
) -> None:
    """``inserting`` skips a field's preparation for values it would leave unchanged on
    PostgreSQL (``statements._AS_IS_ON_POSTGRES``): each class with each of its types, and the
    rows a call inserts, give what the fields' own preparation gives."""
    if not on_postgres:
        pytest.skip("every value is prepared by its field elsewhere")
    samples: dict[type, list[Any]] = {
        str: ["", "gpt-4o", "ü"],
        bool: [True, False],
        Decimal: [Decimal("0"), Decimal("1.2345678901"), Decimal("-3")],
        UUID: [uuid4()],
    }
    for field_class, types in sql._AS_IS_ON_POSTGRES.items():
        if field_class is models.ForeignKey:
            continue  # prepared by its target field, checked through the rows below
        field = (
            field_class(max_digits=30, decimal_places=10)
            if field_class is models.DecimalField
            else field_class()
        )
        for kind in types:
            for value in samples[kind]:
                prepared = field.get_db_prep_save(value, connection)
                assert (prepared, type(prepared)) == (value, type(value)), (field_class, value)
    field = models.DateTimeField()
    now = timezone.now()
    assert field.get_db_prep_save(now, connection) is now
    reservation = _call(tags={"feature": "search"})
    for obj in [
        Reservation.objects.get(pk=reservation.pk),
        UsageRecord.objects.get(reservation=reservation),
        *reservation.holds.all(),
    ]:
        for field, kind in sql._insert_plan(type(obj), connection.vendor):
            ours = sql._prepared(field, kind, obj, connection)
            theirs = field.get_db_prep_save(field.pre_save(obj, True), connection)
            assert type(ours) is type(theirs), field.name
            # psycopg's JSON wrapper compares by identity: compare what it wraps
            assert getattr(ours, "obj", ours) == getattr(theirs, "obj", theirs), field.name
