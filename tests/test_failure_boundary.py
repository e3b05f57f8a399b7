"""The failure boundary (issue #10, item 3): an operational database failure becomes
``LedgerUnavailable`` (a 503 that says "retry"); a fault in our own SQL, schema or data surfaces
as the database error it is, logged with its traceback. Real errors from the real drivers, on
whichever database the suite runs on; the outages themselves (database down, lock waits) are in
test_fail_closed.py."""

from __future__ import annotations

import logging
from decimal import Decimal
from unittest import mock

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections

from llm_budgets import budgets
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import ledger_guard, operational
from llm_budgets.db.ledger import ledger_db
from llm_budgets.engine import admission
from llm_budgets.exceptions import LedgerUnavailable
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Budget, Counter, Reservation
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed


def raise_sqlstate(code: str) -> None:
    """PostgreSQL raises an error with this SQLSTATE; psycopg builds its own class for it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'raised for the test' USING ERRCODE = '{code}'; END $$"
        )


OUTAGES = {
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "55P03": "lock not available (lock_timeout)",
    "57014": "query canceled (statement_timeout)",
    "57P01": "admin shutdown",
    "53300": "too many connections",
    "08006": "connection failure",
    "25P03": "idle in transaction session timeout",
}
FAULTS = {
    "42703": "undefined column",
    "42601": "syntax error",
    "22003": "numeric value out of range",
    "22P02": "invalid text representation",
    "23505": "unique violation",
    "23503": "foreign key violation",
    "XX000": "internal error",
}


@pytest.mark.django_db
@pytest.mark.parametrize("code", sorted(OUTAGES))
def test_postgresql_outages_become_ledger_unavailable(code: str, on_postgres: bool) -> None:
    if not on_postgres:
        pytest.skip("PostgreSQL SQLSTATEs (SQLite's result codes are tested below)")
    with pytest.raises(LedgerUnavailable) as excinfo, ledger_guard("a test"):
        raise_sqlstate(code)
    assert excinfo.value.__cause__.__cause__.sqlstate == code  # the driver's own error
    assert excinfo.value.retry_after >= 1


@pytest.mark.django_db
@pytest.mark.parametrize("code", sorted(FAULTS))
def test_postgresql_faults_surface_as_themselves(
    code: str, on_postgres: bool, caplog: pytest.LogCaptureFixture
) -> None:
    if not on_postgres:
        pytest.skip("PostgreSQL SQLSTATEs (SQLite's result codes are tested below)")
    with (
        caplog.at_level(logging.ERROR, logger="llm_budgets"),
        pytest.raises(DatabaseError) as excinfo,
        ledger_guard("a test"),
    ):
        raise_sqlstate(code)
    assert not isinstance(excinfo.value, LedgerUnavailable)
    assert excinfo.value.__cause__.sqlstate == code
    (record,) = caplog.records
    assert record.exc_info is not None  # logged with the traceback
    assert "not an outage" in record.getMessage()


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_terminates_is_an_outage(on_postgres: bool) -> None:
    """A real admin shutdown of our backend (``pg_terminate_backend``): the next statement fails
    and the call is refused as retryable; the next call reconnects and is admitted."""
    if not on_postgres:
        pytest.skip("PostgreSQL terminates backends; SQLite has none")
    seed(limit="100")
    reserve_30().release()
    ledger = ledger_db()  # the ledger's own connection (llm_budgets.db.ledger)
    with ledger.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    with pytest.raises(LedgerUnavailable) as excinfo:
        reserve_30()
    assert operational(excinfo.value.__cause__)
    ledger.close()  # Django discards a broken connection at the end of a request
    assert reserve_30().amount == Decimal(30)
    assert counters_drift() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "statement",
    ["SELEC 1", "SELECT no_such_column FROM llm_budgets_counter", "SELECT * FROM no_such_table"],
    ids=["syntax", "column", "table"],
)
def test_a_programming_error_surfaces_on_both_databases(
    statement: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite reports these as ``OperationalError`` (result code SQLITE_ERROR): still ours."""
    with (
        caplog.at_level(logging.ERROR, logger="llm_budgets"),
        pytest.raises(DatabaseError) as excinfo,
        ledger_guard("a test"),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert not isinstance(excinfo.value, LedgerUnavailable)
    assert not operational(excinfo.value)
    assert caplog.records[-1].exc_info is not None


@pytest.mark.django_db(transaction=True)
def test_an_integrity_error_surfaces_on_both_databases() -> None:
    seed(limit="100")
    reserve_30().release()
    counter = Counter.objects.get()
    with pytest.raises(IntegrityError), ledger_guard("a test"):
        Counter.objects.create(budget_id=counter.budget_id, period_start=counter.period_start)


@pytest.mark.django_db(transaction=True)
def test_a_fault_in_admission_sql_surfaces_and_holds_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken statement on the hot path is a 500 to fix, not a 503 to retry; nothing is held."""
    seed(limit="100")
    reserve_30().release()

    def broken(applicable: object, stripe_ids: object = ()) -> sql.Statement:
        return "SELECT no_such_column FROM llm_budgets_counter", []

    with (
        mock.patch.object(admission, "counters_locking", broken),
        caplog.at_level(logging.ERROR, logger="llm_budgets"),
        pytest.raises(DatabaseError) as excinfo,
    ):
        reserve_30()
    assert not isinstance(excinfo.value, LedgerUnavailable)
    assert "admission" in caplog.records[-1].getMessage()
    assert caplog.records[-1].exc_info is not None
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == 0


@pytest.mark.django_db(transaction=True)
def test_a_budget_removed_during_admission_is_refused_as_retryable() -> None:
    """The first call of a period creates its counters outside the locking transaction; if a
    budget is deleted meanwhile, the counter cannot be created (foreign key): the call is
    refused with a retryable error, never a raw IntegrityError or a private exception."""
    seed(limit="100")
    budget = Budget.objects.get()
    real = admission.applicable_budgets

    def then_removed(*args: object, **kwargs: object) -> object:
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        Budget.objects.filter(pk=budget.pk).delete()
        return found

    with (
        mock.patch.object(admission, "applicable_budgets", then_removed),
        pytest.raises(LedgerUnavailable) as excinfo,
    ):
        reserve_30()
    assert "changed while it was admitted" in str(excinfo.value)
    assert Reservation.objects.count() == 0
    assert Counter.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_counters_that_stay_missing_are_refused_as_retryable() -> None:
    """Counters created, then gone again before the retry locks them: refused, not leaked."""
    seed(limit="100")

    def nothing_locked(applicable: object, stripe_ids: object = ()) -> sql.Statement:
        return "SELECT 1 WHERE 1 = 0", []  # no row: every counter missing

    with (
        mock.patch.object(admission, "counters_locking", nothing_locked),
        pytest.raises(LedgerUnavailable),
    ):
        reserve_30()
    assert Reservation.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_in_process_staff_services_and_reads_refuse_as_ledger_unavailable(
    on_postgres: bool,
) -> None:
    """An outage reaches an in-process caller as the app's own ``LedgerUnavailable`` on every
    path, as the REST API's 503 (issue #38, item 7: the fault soak saw raw OperationalError from
    ``status``, ``set_limit``, the spend resets, ``trip`` and ``clear``; the soak of 10^6
    operations' first runs, from the prepaid balance's services)."""
    if not on_postgres:
        pytest.skip("PostgreSQL terminates backends; SQLite has none")
    from llm_budgets.billing import credits
    from llm_budgets.engine.adjustments import budget_spend_reset

    seed(limit="100")
    reserve_30().commit(input_tokens=0, output_tokens=100)
    budgets.trip(tenant="acme", reason="r", actor="a")
    budget = Budget.objects.get()
    budgets.ensure_tenant(tenant="prepaid", name="Prepaid")
    account = credits.balance_open(tenant="prepaid")
    calls = {
        "status": lambda: budgets.status(tenant="acme"),
        "set_limit": lambda: budgets.set_limit(tenant="acme", amount=Decimal(5), window="month"),
        "spend reset": lambda: budget_spend_reset(budget=budget, reason="r", actor="a"),
        "trip": lambda: budgets.trip(tenant="acme", end_user="u", reason="r", actor="a"),
        "clear": lambda: budgets.clear(tenant="acme", reason="r", actor="a"),
        "explain": lambda: budgets.explain(
            tenant="acme",
            provider=FAKE_PROVIDER,
            model=FAKE_MODEL,
            input_tokens=0,
            max_output_tokens=100,
        ),
        "balance open": lambda: credits.balance_open(tenant="prepaid", top_up_url="https://x"),
        "account": lambda: credits.account_of("prepaid"),
        "balance": lambda: credits.balance_state(account),
        "credit add": lambda: credits.credit_add(account=account, amount="5", reason="r"),
        "balance adjust": lambda: credits.balance_adjust(
            tenant="prepaid", amount="1", direction="add", actor="a", reason="r"
        ),
        "recharge": lambda: credits.recharge_set(tenant="prepaid", below=None, amount=None),
        "credit expiry": credits.credits_expire,
    }
    for name, call in calls.items():
        for db in {id(c): c for c in (connections["default"], ledger_db())}.values():
            db.ensure_connection()
            pid = db.connection.info.backend_pid
            other = connections.create_connection("default")
            try:
                with other.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            finally:
                other.close()
        try:
            call()
        except LedgerUnavailable:
            pass
        else:
            raise AssertionError(f"{name} was not refused")
        finally:
            connection.close()
            ledger_db().close()
