"""A write whose answer was lost after the database committed it (issue #38, item 7): the fault
soak found commits reported ``ledger_unavailable`` that had happened, while the error and the
docs said "nothing changed". The refusal now says what the action may have left behind, and the
retry it asks for is safe: the same settlement again settles once; a reserve again with the same
idempotency key gets back the hold the lost answer took, rather than holding twice."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from llm_budgets import budgets
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.exceptions import LedgerUnavailable
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Reservation, UsageRecord
from tests.factories import reserve_30, seed

# Real commits: the ledger's transaction must be the outermost, not a test's savepoint.
real_commits = pytest.mark.django_db(transaction=True)


@contextmanager
def answer_lost_after_commit() -> Iterator[list[int]]:
    """The next COMMIT reaches the database and is applied, then the connection fails before
    its answer arrives (what a cut after COMMIT looks like to the driver). Yields how many
    commits were cut (one at most)."""
    original = BaseDatabaseWrapper._commit
    cut: list[int] = []

    def commit_then_cut(self: Any) -> Any:
        result = original(self)
        if not cut:
            cut.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return result

    with mock.patch.object(BaseDatabaseWrapper, "_commit", commit_then_cut):
        yield cut


@real_commits
def test_a_commit_whose_answer_was_lost_says_unknown_and_its_retry_settles_once() -> None:
    seed(limit="100")
    hold = reserve_30()
    with answer_lost_after_commit() as cut, pytest.raises(LedgerUnavailable) as refused:
        budgets.commit(hold.id, input_tokens=0, output_tokens=500)
    assert cut == [1]
    message = str(refused.value)
    assert "during commit" in message
    assert "outcome is unknown" in message
    assert "Retry the same request" in message
    assert "nothing" not in message.lower()
    # It happened: the database committed it.
    assert Reservation.objects.get(pk=hold.id).state == "committed"
    # The retry the message asks for settles nothing twice.
    again = budgets.commit(hold.id, input_tokens=0, output_tokens=500)
    assert again.cost == Decimal(15)
    assert UsageRecord.objects.filter(reservation_id=hold.id).count() == 1
    counter = Counter.objects.get()
    assert (counter.spent, counter.reserved) == (Decimal(15), Decimal(0))
    assert counters_drift() == []


@real_commits
def test_a_reserve_whose_answer_was_lost_is_recovered_by_its_idempotency_key() -> None:
    seed(limit="100")
    reserve_30().release()  # the period's counter exists: the next admission is one commit
    with answer_lost_after_commit() as cut, pytest.raises(LedgerUnavailable) as refused:
        reserve_30(idempotency_key="call-7")
    assert cut == [1]
    message = str(refused.value)
    assert "during admission" in message
    assert "retry with the same idempotency key" in message
    assert "expires and is charged as estimated" in message
    # The lost answer's hold exists ...
    taken = Reservation.objects.get(idempotency_key="call-7")
    assert taken.state == "held"
    # ... and the retry with the same key returns it instead of holding again.
    hold = reserve_30(idempotency_key="call-7")
    assert hold.id == taken.pk
    assert Reservation.objects.filter(state="held").count() == 1
    assert Counter.objects.get().reserved == Decimal(30)


@pytest.mark.parametrize(
    ("action", "says"),
    [
        ("release", "Retry the same request: settling is idempotent"),
        ("extend", "Retry the same request: settling is idempotent"),
        ("mark uncertain", "Retry the same request: settling is idempotent"),
        ("admission", "retry with the same idempotency key"),
        ("read", "Nothing the request asked for was done"),
        ("authentication", "Nothing the request asked for was done"),
        ("kill switch trip", "Check before repeating it"),
    ],
)
def test_each_kind_of_action_says_what_a_refusal_may_have_left(action: str, says: str) -> None:
    with pytest.raises(LedgerUnavailable) as refused, ledger_guard(action):
        raise OperationalError("server closed the connection unexpectedly")
    assert says in str(refused.value)
    assert refused.value.retry_after >= 1
