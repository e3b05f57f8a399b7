from __future__ import annotations

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

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
