"""What a guarded call costs beyond the ledger's two transactions (issue #39 item 5): its SQL is
the hold's and the settlement's and nothing else, plain or streamed, so a lookup added to the
guard's path (a price, a tenant, a kill switch) fails here before it shows in bench/guard.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import openai
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from llm_budgets import budgets
from llm_budgets.integrations import guarding
from llm_budgets.integrations.openai import guard
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Reservation
from llm_budgets.pricing import tokens
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT
from tests.integrations import GPT, seed_tenant

pytestmark = pytest.mark.django_db

# Quoted values, numbers and NULLs in the SQL as logged (each call's ids, amounts and times).
_LITERALS = re.compile(r"'[^']*'|\b\d+(?:\.\d+)?\b|\bNULL\b")
MESSAGES = [{"role": "user", "content": "Summarise this ticket in one line."}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    seed_tenant()
    server = FakeOpenAI()
    yield server
    server.stop()


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL sent inside the block, without the test's savepoints (which stand in for BEGIN
    and COMMIT) and the lock-timeout setting each transaction starts with. The ledger joins the
    test's connection here; a query on any other alias would fail the test (not allowed)."""
    sent: list[str] = []
    with CaptureQueriesContext(connection) as captured:
        yield sent
    for query in captured.captured_queries:
        text = query["sql"] or ""
        if "SAVEPOINT" not in text and not text.startswith("SELECT set_config"):
            sent.append(_LITERALS.sub("?", text))  # the statement, not this call's values


def _bare_cycle() -> list[str]:
    """The ledger alone: ``budgets.reserve`` then ``hold.commit``, as bench/admission.py runs."""
    with statements() as sent:
        hold = budgets.reserve(
            tenant="acme",
            end_user="u-1",
            provider="openai",
            model=GPT,
            input_tokens=20,
            max_output_tokens=100,
        )
        hold.commit(input_tokens=20, output_tokens=12)
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_guarded_call_sends_only_the_holds_and_the_settlements_statements(
    fake: FakeOpenAI, stream: bool
) -> None:
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=0)
    # No look for a kill switch while the stream runs (that one is timed, not per call).
    client = guard(sdk, tenant="acme", end_user="u-1", switch_check_seconds=3600)

    def call() -> None:
        result = client.chat.completions.create(
            model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=stream, timeout=WAIT
        )
        if stream:
            for _chunk in result:
                pass

    call()  # the end user's first call creates it and its counters
    with statements() as guarded:
        call()
    bare = _bare_cycle()
    # PostgreSQL: the hold reads its context and the locked counters, then writes once; the
    # settlement locks the reservation, then writes once. SQLite runs each write on its own.
    assert len(bare) == (5 if connection.vendor == "postgresql" else 10), "\n".join(bare)
    assert guarded == bare, "\n".join(guarded)
    assert set(Reservation.objects.values_list("state", flat=True)) == {"committed"}
    assert counters_drift() == []


def test_a_stream_that_ends_with_its_usage_never_counts_its_deltas(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-delta count is only for a stream stopped before the provider's usage arrived;
    otherwise the provider's count is charged and counting every delta was wasted work."""
    counted: list[str] = []

    def counter(provider: str | None, model: str) -> Callable[[str], int]:
        real = tokens.text_counter(provider, model)
        return lambda text: counted.append(text) or real(text)

    monkeypatch.setattr(guarding, "text_counter", counter)
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=0)
    client = guard(sdk, tenant="acme", end_user="u-1", switch_check_seconds=3600)
    fake.then(chunks=5)
    for _chunk in client.chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True, timeout=WAIT
    ):
        pass
    assert counted == []
    assert Reservation.objects.get().state == "committed"


def test_deltas_counted_late_count_as_each_counted_at_once() -> None:
    counter = guarding.OutputCounter(provider="openai", model=GPT, ceiling=1000)
    deltas = ["Hello", " wor", "ld, <|endoftext|>", "", " é" * 30]
    each = tokens.text_counter("openai", GPT)
    for text in deltas[:2]:
        counter.add(text)
    assert counter.tokens == each("Hello") + each(" wor")
    for text in deltas[2:]:
        counter.add(text)
    assert counter.tokens == sum(each(text) for text in deltas)
    assert counter.deltas == 4  # an empty delta is no delta
