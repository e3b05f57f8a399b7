"""Admissions and settlements of the same model at the same time (PostgreSQL locks rows)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.reconcile import counters_drift
from tests.concurrency import run_threads
from tests.factories import reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


# The question here is deadlock, not waiting: SQLite's busy handler is not fair, so on a loaded
# machine one writer can wait past the default 3 s. PostgreSQL reports a deadlock at once.
@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 30})
def test_reserving_and_committing_together_never_deadlocks() -> None:
    # Regression: commit used to lock the price row along with the reservation, while each
    # admission key-share locks that row for its foreign key and waits on counters.
    seed(limit="100000")

    def cycle(_: int) -> str:
        for _ in range(5):
            try:
                reserve_30().commit(input_tokens=0, output_tokens=500)
            except BudgetExceeded:
                return "refused"
        return "ok"

    assert run_threads(8, cycle) == ["ok"] * 8
    assert counters_drift() == []
