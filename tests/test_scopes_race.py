"""Races on the new scopes (issue #16): the seed race on a run budget and on a tag budget, and
20 concurrent first calls of a new run under ``run="*"`` (its run row and counter created on
first sight). Real threads and processes, each on its own connection, on both databases."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db import connections

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded, RunClosed
from llm_budgets.models import AuditEvent, Counter, Reservation, Run, Scope
from tests.concurrency import (
    lock_waited,
    overspent_counters,
    patient_lock_waits,
    run_processes,
    run_threads,
)
from tests.factories import reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    with patient_lock_waits():
        yield


def _outcome(**call: object) -> str:
    try:
        reserve_30(**call)
    except BudgetExceeded:
        return "refused"
    return "admitted"


def _in_run(_: int) -> str:
    return _outcome(run="run-new")


def _tagged(_: int) -> str:
    return _outcome(tags={"project": "alpha"})


def _own_run(index: int) -> str:
    return _outcome(run=f"run-{index % 4}")  # four new runs, five calls each


def test_twenty_first_calls_of_a_new_run_admit_exactly_what_fits() -> None:
    seed(limit="10000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("100"), window="lifetime")
    results = run_threads(20, _in_run)
    assert results.count("admitted") == 3, results
    assert Run.objects.filter(external_id="run-new").count() == 1
    counter = Counter.objects.get(budget__scope=Scope.RUN_DEFAULT)
    assert counter.reserved == Decimal(90)
    assert overspent_counters() == []


def test_new_runs_started_together_each_get_their_own_counter() -> None:
    seed(limit="10000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("60"), window="lifetime")
    results = run_threads(20, _own_run)
    assert results.count("admitted") == 8, results  # two of 30 in each of four runs
    shares = Counter.objects.filter(budget__scope=Scope.RUN_DEFAULT)
    assert sorted(c.reserved for c in shares) == [Decimal(60)] * 4
    assert Run.objects.count() == 4
    assert overspent_counters() == []


@pytest.mark.parametrize("calls", [10, 50])
def test_seed_race_on_a_run_budget(calls: int) -> None:
    seed(limit="10000")
    budgets.set_limit(tenant="acme", run="run-new", amount=Decimal("100"), window="lifetime")
    results = run_threads(calls, _in_run)
    assert (results.count("admitted"), results.count("refused")) == (3, calls - 3), results
    assert Counter.objects.get(budget__scope=Scope.RUN).reserved == Decimal(90)
    assert Reservation.objects.count() == 3
    assert overspent_counters() == []


@pytest.mark.parametrize("calls", [10, 50])
def test_seed_race_on_a_tag_budget(calls: int) -> None:
    seed(limit="10000")
    budgets.set_limit(
        tenant="acme", tag=("project", "alpha"), amount=Decimal("100"), window="month"
    )
    results = run_threads(calls, _tagged)
    assert (results.count("admitted"), results.count("refused")) == (3, calls - 3), results
    assert Counter.objects.get(budget__scope=Scope.TAG).reserved == Decimal(90)
    # All or nothing: the tenant's counter holds exactly what the tag admitted.
    assert Counter.objects.get(budget__scope=Scope.TENANT).reserved == Decimal(90)
    assert overspent_counters() == []


def test_processes_race_for_a_new_run() -> None:
    seed(limit="10000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("100"), window="lifetime")
    results = run_processes(20, _in_run)
    values = [value for status, value in results if status == "ok"]
    assert (values.count("admitted"), values.count("refused")) == (3, 17), results
    assert Counter.objects.get(budget__scope=Scope.RUN_DEFAULT).reserved == Decimal(90)


def test_a_close_committed_while_a_call_waits_refuses_that_call(
    on_postgres: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call read the run as open, then waited for its counters, which ``run_close`` held
    while closing. Admission reads the close once it has the counters, so the call is refused
    (``RunClosed``), not admitted after the close."""
    if not on_postgres:
        pytest.skip("SQLite serialises every writer: a close cannot commit while a call waits")
    seed(limit="10000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("100"), window="lifetime")
    reserve_30(run="r").release()  # the run and its counters exist
    closing, go = threading.Event(), threading.Event()
    create = AuditEvent.objects.create

    def paused_create(**fields: object) -> AuditEvent:
        # run_close writes its audit event after it locked the counters and set closed_at.
        if fields.get("action") == "run.close":
            closing.set()
            assert go.wait(30)
        return create(**fields)

    monkeypatch.setattr(AuditEvent.objects, "create", paused_create)
    outcome: list[object] = []

    def close() -> None:
        try:
            budgets.close_run(tenant="acme", run="r")
        finally:
            connections.close_all()

    def call() -> None:
        try:
            reserve_30(run="r")
            outcome.append("admitted")
        except RunClosed as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    closer, caller = threading.Thread(target=close), threading.Thread(target=call)
    closer.start()
    assert closing.wait(30), "run_close never reached its audit event"
    caller.start()
    # The call is past its checks, waiting for the counters (a lock wait in this database only:
    # CI runs other legs' databases beside it).
    assert lock_waited(seconds=20), "the call never waited for the counters"
    go.set()
    closer.join(30)
    caller.join(30)
    assert not closer.is_alive()
    assert not caller.is_alive()
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], RunClosed), outcome
    assert Reservation.objects.filter(state="held").count() == 0
