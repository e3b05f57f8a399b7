"""The seed race (issue D2): limit 100, worst case 30, calls started together."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import Counter, Reservation
from tests.concurrency import patient_lock_waits, run_processes, run_threads
from tests.factories import reserve_30, seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


@pytest.fixture(autouse=True)
def patient() -> Iterator[None]:
    with patient_lock_waits():
        yield


def _reserve(_: int) -> str:
    try:
        reserve_30()
    except BudgetExceeded:
        return "refused"
    return "admitted"


@pytest.mark.parametrize("calls", [10, 50])
def test_threads_admit_exactly_what_fits(calls: int) -> None:
    seed(limit="100")
    results = run_threads(calls, _reserve)
    assert results.count("admitted") == 3, results
    assert results.count("refused") == calls - 3, results
    counter = Counter.objects.get()
    assert counter.reserved == Decimal(90)
    assert Reservation.objects.count() == 3


@pytest.mark.parametrize("calls", [10, 50])
def test_processes_admit_exactly_what_fits(calls: int) -> None:
    seed(limit="100")
    results = run_processes(calls, _reserve)
    values = [value for status, value in results if status == "ok"]
    assert (values.count("admitted"), values.count("refused")) == (3, calls - 3), results
    assert Counter.objects.get().reserved == Decimal(90)
