"""The ledger's own transactions (DESIGN.md invariant 8, issue #37; llm_budgets.db.ledger).

On PostgreSQL, money movements commit on the ledger's own connection whatever transaction the
caller is in: a host's rollback never erases a charge, and a hold never keeps counter rows locked
while the host's transaction goes on. Configuration joins the caller's transaction. On SQLite
(one writer) and inside a test's own transaction the ledger joins the caller's connection.

The module runs with ``transaction=True``; the suite's conftest allows the ledger's alias there
(``ledger_allowed``), as a host's own test would with ``databases="__all__"``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from llm_budgets import budgets, signals
from llm_budgets.db.ledger import LEDGER_ALIAS, ledger_db, ledger_joins_caller
from llm_budgets.exceptions import BudgetExceeded, ConfigurationUncommitted, LedgerUnavailable
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    BillingLine,
    Budget,
    Counter,
    KillSwitch,
    Reservation,
    ReservationState,
    Tenant,
    ThresholdCrossing,
    UsageRecord,
)
from tests.concurrency import run_threads
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed

pytestmark = pytest.mark.django_db(transaction=True)


class HostRolledBack(Exception):
    """What a host's view raises after the provider answered."""


@pytest.fixture
def postgres(on_postgres: bool) -> None:
    if not on_postgres:
        pytest.skip("SQLite has one writer: the ledger joins the caller's transaction there")


def rolled_back(work: Callable[[], Any]) -> Any:
    """Run ``work`` inside a host's ``atomic()`` block that then rolls back; its result."""
    result: list[Any] = []
    try:
        with transaction.atomic():
            result.append(work())
            raise HostRolledBack
    except HostRolledBack:
        return result[0]
    raise AssertionError("the host's block did not roll back")


def test_on_postgresql_the_ledger_has_a_connection_of_its_own(postgres: None) -> None:
    assert not ledger_joins_caller()
    assert ledger_db() is connections[LEDGER_ALIAS]
    assert ledger_db() is not connections[DEFAULT_DB_ALIAS]


def test_a_charge_survives_the_hosts_rollback(postgres: None) -> None:
    """Status, ledger and Stripe outbox all keep the charge of a call whose host transaction
    rolled back after the provider answered."""
    seed(limit="100")
    budgets.link_stripe_customer(tenant="acme", customer_id="cus_seams")

    def call() -> Any:
        hold = reserve_30()
        hold.commit(input_tokens=0, output_tokens=400)  # 12
        return hold.id

    rid = rolled_back(call)
    assert Reservation.objects.get(pk=rid).state == ReservationState.COMMITTED
    assert [line.cost for line in UsageRecord.objects.all()] == [Decimal(12)]
    assert BillingLine.objects.count() == 1
    (row,) = budgets.status(tenant="acme")
    assert (row.spent, row.reserved) == (Decimal(12), Decimal(0))
    assert counters_drift() == []


def test_a_release_and_a_trip_survive_the_hosts_rollback(postgres: None) -> None:
    seed(limit="100")
    rid = rolled_back(lambda: reserve_30().id)
    assert Reservation.objects.get(pk=rid).state == ReservationState.HELD  # durable
    rolled_back(lambda: budgets.release(rid))
    assert Reservation.objects.get(pk=rid).state == ReservationState.RELEASED
    rolled_back(lambda: budgets.trip(tenant="acme", reason="abuse", actor="ops"))
    assert KillSwitch.objects.filter(tenant__external_id="acme").count() == 1
    assert counters_drift() == []


@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 1})
def test_a_hold_taken_in_a_host_block_locks_nothing_while_the_block_goes_on(
    postgres: None,
) -> None:
    """Another connection admits a call on the same counters while the host's block that took
    the first hold is still open: no lock of the first is kept past ``reserve``'s return (before,
    it waited for the host's transaction and was refused as ledger_unavailable)."""
    seed(limit="100")
    outcome: list[object] = []

    def other_request() -> None:
        try:
            outcome.append(reserve_30().release())
        except Exception as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():
        reserve_30()
        thread = threading.Thread(target=other_request)
        thread.start()
        thread.join(30)
    assert outcome == ["released"], outcome


# ---- ATOMIC_REQUESTS: concurrent requests of one tenant, each holding across a slow provider

REQUESTS = 4
provider_barrier = threading.Barrier(REQUESTS)


def guarded_view(request: HttpRequest) -> HttpResponse:
    """A host's view: reserve, call the provider, commit. The fake provider answers only once
    every request has been admitted (a barrier, not a clock)."""
    hold = budgets.reserve(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=100,  # 3
    )
    provider_barrier.wait(timeout=30)  # BrokenBarrierError: one admission waited on another
    hold.commit(input_tokens=0, output_tokens=50)  # 1.5
    if request.GET.get("fail"):
        raise HostRolledBack("the view fails after the provider answered")
    return HttpResponse("ok")


urlpatterns = [path("guarded/", guarded_view)]


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """The cookiecutter-django default: every request in one transaction."""
    default = connections.settings[DEFAULT_DB_ALIAS]
    default["ATOMIC_REQUESTS"] = True
    try:
        with override_settings(ROOT_URLCONF=__name__):
            yield
    finally:
        default["ATOMIC_REQUESTS"] = False


def test_atomic_requests_admit_concurrent_requests_of_one_tenant(
    postgres: None, atomic_requests: None
) -> None:
    seed(limit="100")
    provider_barrier.reset()
    answers = run_threads(REQUESTS, lambda i: Client().get("/guarded/").status_code)
    assert answers == [200] * REQUESTS
    (row,) = budgets.status(tenant="acme")
    assert row.spent == Decimal("1.5") * REQUESTS
    assert counters_drift() == []


def test_atomic_requests_keep_the_charge_of_a_view_that_fails(
    postgres: None, atomic_requests: None
) -> None:
    seed(limit="100")
    barrier = threading.Barrier(1)
    global provider_barrier
    saved, provider_barrier = provider_barrier, barrier
    try:
        with pytest.raises(HostRolledBack):
            Client().get("/guarded/?fail=1")
    finally:
        provider_barrier = saved
    (line,) = UsageRecord.objects.all()
    assert line.cost == Decimal("1.5")
    assert counters_drift() == []


# ---- What the ledger does after it commits


def test_after_commit_actions_run_when_the_ledger_commits(postgres: None) -> None:
    """``reservation_settled``, the kill-switch announcement and the threshold scan's signal
    (the threshold task) are sent though the host then rolls back."""
    seed(limit="100")
    heard: list[str] = []

    def settled(**kwargs: Any) -> None:
        heard.append(f"settled {kwargs['state']} {kwargs['cost'].normalize()}")
        assert not connection.in_atomic_block or connection.alias == DEFAULT_DB_ALIAS

    def tripped(**kwargs: Any) -> None:
        heard.append("tripped")

    def crossed(**kwargs: Any) -> None:
        heard.append(f"crossed {kwargs['threshold']}")

    from llm_budgets.tasks import scan_thresholds

    signals.reservation_settled.connect(settled, dispatch_uid="t1")
    signals.kill_switch_tripped.connect(tripped, dispatch_uid="t2")
    signals.threshold_crossed.connect(crossed, dispatch_uid="t3")
    try:
        rolled_back(
            lambda: reserve_30(max_output_tokens=2000).commit(input_tokens=0, output_tokens=2000)
        )  # 60 of 100
        rolled_back(lambda: reserve_30().release())
        rolled_back(scan_thresholds)
        rolled_back(lambda: budgets.trip(tenant="acme", reason="r", actor="a"))
    finally:
        signals.reservation_settled.disconnect(dispatch_uid="t1")
        signals.kill_switch_tripped.disconnect(dispatch_uid="t2")
        signals.threshold_crossed.disconnect(dispatch_uid="t3")
    assert heard[:2] == ["settled committed 6E+1", "settled released 0"]
    assert "crossed 50" in heard
    assert heard[-1] == "tripped"
    assert ThresholdCrossing.objects.filter(threshold=50).exists()


# ---- Configuration joins the caller's transaction


@pytest.mark.usefixtures("postgres")
def test_configuration_rolls_back_with_the_host() -> None:
    def organisation() -> None:
        budgets.ensure_tenant(tenant="newco", name="NewCo")
        budgets.set_limit(tenant="newco", amount=Decimal(50), window="month")

    rolled_back(organisation)
    assert not Tenant.objects.filter(external_id="newco").exists()
    assert not Budget.objects.filter(tenant__external_id="newco").exists()


def test_a_call_in_the_transaction_that_created_its_tenant_is_refused_at_once(
    postgres: None,
) -> None:
    """The documented outcome: ``configuration_uncommitted``, nothing held, no wait on the
    host's own locks; after the host commits the same call is admitted."""
    seed(limit="100")
    with transaction.atomic():
        budgets.ensure_tenant(tenant="newco", name="NewCo")
        budgets.set_limit(tenant="newco", amount=Decimal(50), window="month")
        with pytest.raises(ConfigurationUncommitted) as excinfo:
            reserve_30(tenant="newco")
        assert "transaction.on_commit" in str(excinfo.value)
    assert not Reservation.objects.filter(tenant__external_id="newco").exists()
    reserve_30(tenant="newco").release()


@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 5})
def test_a_call_after_its_budget_changed_in_the_same_transaction_does_not_wait(
    postgres: None,
) -> None:
    """The host changed acme's limit (its budget row locked by the host's transaction) and then
    admits a call of acme in the same transaction: refused at once, not after a lock wait."""
    seed(limit="100")
    reserve_30().release()  # acme's counters exist
    with transaction.atomic():
        budgets.set_limit(tenant="acme", amount=Decimal(200), window="month")
        with pytest.raises(ConfigurationUncommitted):
            reserve_30()
        # Another tenant's call is not affected by acme's pending change.
        seed(limit="100", tenant="other")
    reserve_30(tenant="other").release()


# ---- Tests of hosts


def test_with_transaction_true_the_ledger_commits_on_its_own(postgres: None) -> None:
    """A hold taken inside the test's own block is visible to any other connection at once."""
    seed(limit="100")
    with transaction.atomic():
        reserve_30()
        assert _reservations_seen_elsewhere() == 1


def _reservations_seen_elsewhere() -> int:
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {Reservation._meta.db_table}")
            return int(cursor.fetchone()[0])
    finally:
        other.close()


@pytest.mark.django_db(transaction=False)
def test_in_a_tests_own_transaction_the_ledger_joins_it(on_postgres: bool) -> None:
    """``TestCase`` / ``django_db``: the ledger's rows stay in the test's transaction (rolled
    back with it), unseen by any other connection."""
    assert ledger_joins_caller()
    assert ledger_db() is connections[DEFAULT_DB_ALIAS]
    if not on_postgres:
        return  # SQLite: a second connection would wait for the test's write lock
    seed(limit="100")
    reserve_30()
    assert Reservation.objects.count() == 1
    assert _reservations_seen_elsewhere() == 0


def test_a_test_that_does_not_allow_the_alias_joins_the_tests_connection(
    postgres: None,
) -> None:
    """``transaction=True`` without the ledger's alias in ``databases``: Django forbids the
    alias, and the ledger uses the test's connection instead of failing."""
    from django.test.testcases import TransactionTestCase

    class Forbidding(TransactionTestCase):
        databases = {DEFAULT_DB_ALIAS}

        def runTest(self) -> None:
            seed(limit="100")
            assert ledger_db() is connections[DEFAULT_DB_ALIAS]
            reserve_30().release()

    import unittest

    result = unittest.TestResult()
    unittest.TestSuite([Forbidding()]).run(result)
    assert result.testsRun == 1
    assert result.wasSuccessful(), result.errors + result.failures


def test_on_sqlite_the_ledger_joins_the_callers_transaction(on_postgres: bool) -> None:
    if on_postgres:
        pytest.skip("PostgreSQL: the ledger has a connection of its own (tested above)")
    assert ledger_joins_caller()
    seed(limit="100")
    rolled_back(lambda: reserve_30().commit(input_tokens=0, output_tokens=400))
    assert not UsageRecord.objects.exists()  # the documented risk, warned of by W051
    assert not Counter.objects.filter(spent__gt=0).exists()


def test_the_ledger_may_be_told_to_join_the_caller(postgres: None) -> None:
    """``LEDGER_DATABASE = "default"``: the old behaviour, a documented opt-out."""
    seed(limit="100")
    with override_settings(LLM_BUDGETS={"LEDGER_DATABASE": "default"}):
        assert ledger_joins_caller()
        rolled_back(lambda: reserve_30().commit(input_tokens=0, output_tokens=400))
    assert not UsageRecord.objects.exists()


def test_a_lost_ledger_connection_is_refused_then_reopened(postgres: None) -> None:
    """The ledger's connection is an ordinary alias: Django closes it like the request's."""
    seed(limit="100")
    reserve_30().release()
    _ledger_connection_lost()
    from django.db import close_old_connections

    close_old_connections()  # what request_finished does
    reserve_30().release()


@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 1})
def test_a_refusal_while_the_host_locks_its_budget_row_does_not_wait_forever(
    postgres: None,
) -> None:
    """The host locked the budget row by hand (no service noted it). The refused call's record
    references that row: its foreign key is checked at commit, where it waits for the host's
    transaction, which waits for the call. The ledger bounds that wait too (it hung before)."""
    seed(limit="100")
    reserve_30().release()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {Budget._meta.db_table} FOR UPDATE")
        with pytest.raises(BudgetExceeded):
            reserve_30(max_output_tokens=100_000)


def test_a_process_without_requests_heals_its_ledger_connection(postgres: None) -> None:
    """No request boundary closes it (a worker's loop, a command): the next ledger call finds
    the connection broken, closes it and reconnects (the fault soak's processes)."""
    seed(limit="100")
    reserve_30().release()
    _ledger_connection_lost()
    reserve_30().release()  # no close_old_connections() in between


def _ledger_connection_lost() -> None:
    """The server ends the ledger's connection (an admin shutdown); the next call is refused."""
    with ledger_db().cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(LedgerUnavailable):
        reserve_30()
