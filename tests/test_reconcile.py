from __future__ import annotations

from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


def test_a_consistent_ledger_has_no_drift() -> None:
    seed()
    reserve_30().commit(input_tokens=0, output_tokens=500)
    reserve_30()
    reserve_30().release()
    assert counters_drift() == []
    out = StringIO()
    call_command("llm_budgets_reconcile", stdout=out)
    assert "agrees" in out.getvalue()


def test_drift_is_reported_per_counter_and_field() -> None:
    seed()
    reserve_30().commit(input_tokens=0, output_tokens=500)
    Counter.objects.update(spent=Decimal(99))  # tamper, as a bug or a hand edit would
    (drift,) = counters_drift()
    assert (drift.field, drift.stored, drift.expected) == ("spent", Decimal(99), Decimal(15))
    with pytest.raises(CommandError, match="1 counter total"):
        call_command("llm_budgets_reconcile", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db(transaction=True)
def test_a_settlement_committing_between_its_reads_is_not_drift() -> None:
    """PostgreSQL's READ COMMITTED takes a snapshot per statement: a commit landing after the
    ledger lines were summed and before the counters were read looked like drift (seen in the
    crash suite). The check reads in one snapshot, so it sees the commit wholly or not at all."""
    if connection.vendor != "postgresql":
        pytest.skip("the ledger commits on its own connection only on PostgreSQL")
    seed()
    holds = [reserve_30(), reserve_30()]
    holds[0].commit(input_tokens=0, output_tokens=500)
    landed = []

    def commit_after_first_read(execute: Any, sql: str, *args: Any) -> Any:
        result = execute(sql, *args)
        if not landed and "SELECT" in sql:  # the ledger commits between the check's reads
            landed.append(holds[1].commit(input_tokens=0, output_tokens=500))
        return result

    with connection.execute_wrapper(commit_after_first_read):
        assert counters_drift() == []
    assert landed, "the commit did not land during the check"
    assert counters_drift() == []  # and once it has landed, it is seen whole
    assert Counter.objects.get().spent == Decimal(30)
