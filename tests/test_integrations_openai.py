"""The OpenAI guard, with the real ``openai`` package pointed at a fake OpenAI on 127.0.0.1: every
way a call ends, and the ledger and counters after each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal

import openai
import pydantic
import pytest
from asgiref.sync import async_to_sync, sync_to_async

from llm_budgets import budgets
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    KillSwitchActive,
    LedgerUnavailable,
    OutputCeilingRequired,
)
from llm_budgets.integrations.guarding import NotGuarded
from llm_budgets.integrations.openai import guard
from llm_budgets.models import Plan, Reservation, UsageRecord
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT
from llm_budgets.tokens import count_input_tokens
from tests.integrations import (
    GPT,
    GPT_MINI,
    assert_conserved,
    charge_line,
    only_reservation,
    seed_tenant,
    tenant_counter,
)
from tests.services import free_port

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    seed_tenant()
    server = FakeOpenAI()
    yield server
    server.stop()


def _client(base_url: str, *, timeout: object = WAIT, **guard_kwargs: object) -> object:
    sdk = openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0, timeout=timeout
    )
    return guard(sdk, tenant="acme", end_user="u-1", **guard_kwargs)  # type: ignore[arg-type]


def _async_client(base_url: str, **guard_kwargs: object) -> object:
    sdk = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0, timeout=WAIT
    )
    return guard(sdk, tenant="acme", end_user="u-1", **guard_kwargs)  # type: ignore[arg-type]


# -- success -----------------------------------------------------------------------------------


def test_a_chat_completion_is_held_then_charged_its_reported_usage(fake: FakeOpenAI) -> None:
    client = _client(fake.base_url, tags={"feature": "chat"})
    response = client.chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert isinstance(response, openai.types.chat.ChatCompletion)
    reservation = only_reservation()
    # The prompt was counted offline from the request; the ceiling held is the one sent.
    assert reservation.input_tokens == count_input_tokens(
        provider="openai", model=GPT, messages=MESSAGES
    )
    assert fake.last.body["max_completion_tokens"] == reservation.max_output_tokens == 100
    assert fake.last.body["model"] == GPT
    line = charge_line(reservation)
    assert (line.input_tokens, line.cached_input_tokens, line.output_tokens) == (20, 5, 12)
    assert line.reasoning_tokens == 4
    # 15 uncached x 1 + 5 cached x 0.5 + 12 output x 2
    assert line.cost == Decimal("41.5")
    assert line.tags == {"feature": "chat"}
    assert reservation.state == "committed"
    assert (tenant_counter().spent, tenant_counter().reserved) == (Decimal("41.5"), 0)
    assert_conserved()


def test_the_legacy_max_tokens_is_sent_back_as_the_held_ceiling(fake: FakeOpenAI) -> None:
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_tokens=64
    )
    assert fake.last.body["max_tokens"] == 64
    assert "max_completion_tokens" not in fake.last.body


def test_without_a_ceiling_the_plan_default_is_held_and_sent(fake: FakeOpenAI) -> None:
    Plan.objects.create(name="defaults", default_max_output_tokens=77)
    budgets.ensure_tenant("acme", plan="defaults")
    _client(fake.base_url).chat.completions.create(model=GPT, messages=MESSAGES)  # type: ignore[attr-defined]
    assert fake.last.body["max_completion_tokens"] == 77 == only_reservation().max_output_tokens


def test_the_responses_api_is_guarded_too(fake: FakeOpenAI) -> None:
    response = _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
        model=GPT, input="Say hello.", instructions="Be brief.", max_output_tokens=50
    )
    assert response.output_text.startswith("Hello")
    assert fake.last.body["max_output_tokens"] == 50
    line = charge_line(only_reservation())
    assert (line.input_tokens, line.cached_input_tokens, line.output_tokens) == (20, 5, 12)
    assert_conserved()


def test_a_ledger_down_after_the_call_still_returns_the_answer_and_keeps_the_hold(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def ledger_down(*args: object, **kwargs: object) -> None:
        raise LedgerUnavailable("database gone")

    monkeypatch.setattr(budgets.Hold, "commit", ledger_down)
    response = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert response.choices[0].message.content.startswith("Hello")
    reservation = only_reservation()
    assert reservation.state == "held"  # counted until it expires, then charged as estimated
    assert tenant_counter().reserved == reservation.amount
    assert "could not commit" in caplog.text


def test_responses_web_search_is_held_at_its_bound_and_charged_per_search(
    fake: FakeOpenAI,
) -> None:
    client = _client(fake.base_url)
    with pytest.raises(InvalidUsage, match="max_tool_calls"):
        client.responses.create(  # type: ignore[attr-defined]
            model=GPT, input="news?", tools=[{"type": "web_search"}], max_output_tokens=50
        )
    assert fake.requests == []
    client.responses.create(  # type: ignore[attr-defined]
        model=GPT,
        input="news?",
        tools=[{"type": "web_search"}],
        max_tool_calls=3,
        max_output_tokens=50,
    )
    reservation = only_reservation()
    quote = budgets.quote(
        tenant="acme",
        provider="openai",
        model=GPT,
        input_tokens=reservation.input_tokens,
        max_output_tokens=50,
        max_tool_calls={"web_search": 3},
    )
    assert reservation.amount == quote.estimate.amount  # three searches' fees held
    line = charge_line(reservation)
    assert line.tool_calls == {"web_search": 1}
    assert line.cost == Decimal("41.5") + 10  # the tokens and one search
    assert_conserved()


class Answer(pydantic.BaseModel):
    answer: str


def test_structured_outputs_parse_is_guarded_and_counts_the_schema(fake: FakeOpenAI) -> None:
    fake.then(text='{"answer": "hello"}')
    completion = _client(fake.base_url).chat.completions.parse(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, response_format=Answer, max_completion_tokens=100
    )
    assert completion.choices[0].message.parsed == Answer(answer="hello")
    reservation = only_reservation()
    # The JSON schema the SDK sends is part of the prompt that was held.
    assert reservation.input_tokens > count_input_tokens(
        provider="openai", model=GPT, messages=MESSAGES
    )
    assert charge_line(reservation).cost == Decimal("41.5")
    assert_conserved()


def test_an_answer_cut_at_the_ceiling_is_charged_its_usage_not_left_uncertain(
    fake: FakeOpenAI,
) -> None:
    fake.then(text='{"answer": "hel', finish_reason="length")
    with pytest.raises(openai.LengthFinishReasonError):
        _client(fake.base_url).chat.completions.parse(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, response_format=Answer, max_completion_tokens=100
        )
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert charge_line(reservation).output_tokens == 12
    assert_conserved()


def test_an_answer_that_fails_to_parse_keeps_the_hold_counted(fake: FakeOpenAI) -> None:
    fake.then(text="not json")
    with pytest.raises(pydantic.ValidationError):
        _client(fake.base_url).chat.completions.parse(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, response_format=Answer, max_completion_tokens=100
        )
    # Billed by the provider, usage lost with the SDK's error: uncertain, never released.
    assert only_reservation().state == "uncertain"
    assert_conserved()


# -- refusals: nothing is sent -----------------------------------------------------------------


def test_a_refusal_raises_budget_exceeded_and_sends_nothing(fake: FakeOpenAI) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("10"), window="month")
    with pytest.raises(BudgetExceeded):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    assert fake.requests == []
    assert not fake.received.wait(0.2)
    assert Reservation.objects.count() == 0
    assert tenant_counter().reserved == 0


def test_a_kill_switch_refuses_before_sending(fake: FakeOpenAI) -> None:
    budgets.trip(tenant="acme", reason="runaway agent")
    with pytest.raises(KillSwitchActive, match="runaway agent"):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    assert fake.requests == []


def test_no_ceiling_and_no_plan_default_is_refused_before_sending(fake: FakeOpenAI) -> None:
    with pytest.raises(OutputCeilingRequired):
        _client(fake.base_url).chat.completions.create(model=GPT, messages=MESSAGES)  # type: ignore[attr-defined]
    assert fake.requests == []


def test_several_choices_are_refused_before_sending(fake: FakeOpenAI) -> None:
    with pytest.raises(InvalidUsage, match="n must be 1"):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=10, n=3
        )
    assert fake.requests == []


def test_extra_body_cannot_override_what_was_priced(fake: FakeOpenAI) -> None:
    with pytest.raises(InvalidUsage, match="extra_body sets max_completion_tokens"):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT,
            messages=MESSAGES,
            max_completion_tokens=10,
            extra_body={"max_completion_tokens": 100000},
        )
    assert fake.requests == []


def test_both_ceiling_parameters_are_sent_as_the_held_ceiling(fake: FakeOpenAI) -> None:
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=50, max_tokens=5000
    )
    assert (fake.last.body["max_completion_tokens"], fake.last.body["max_tokens"]) == (50, 50)
    assert only_reservation().max_output_tokens == 50


def test_priced_calls_it_cannot_guard_are_refused_and_the_rest_passes_through(
    fake: FakeOpenAI,
) -> None:
    client = _client(fake.base_url)
    with pytest.raises(NotGuarded, match="embeddings"):
        client.embeddings.create(model="text-embedding-3-small", input="x")  # type: ignore[attr-defined]
    with pytest.raises(NotGuarded):
        client.chat.completions.with_raw_response  # type: ignore[attr-defined]  # noqa: B018
    assert client.files is client.unguarded.files  # type: ignore[attr-defined]
    assert fake.requests == []


# -- provider errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state"),
    [(429, "released"), (400, "released"), (503, "released"), (500, "uncertain")],
)
def test_a_provider_error_releases_only_when_it_proves_nothing_was_billed(
    fake: FakeOpenAI, status: int, state: str
) -> None:
    fake.then(kind="status", status=status)
    with pytest.raises(openai.APIStatusError):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    reservation = only_reservation()
    assert reservation.state == state
    assert UsageRecord.objects.count() == 0
    assert tenant_counter().reserved == (reservation.amount if state == "uncertain" else 0)
    assert_conserved()


def test_a_refused_connection_releases(fake: FakeOpenAI) -> None:
    with pytest.raises(openai.APIConnectionError):
        _client(f"http://127.0.0.1:{free_port()}").chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    assert only_reservation().state == "released"
    assert tenant_counter().reserved == 0


def test_a_timeout_keeps_the_hold_counted_as_uncertain(fake: FakeOpenAI) -> None:
    fake.then(kind="stall")
    with pytest.raises(openai.APITimeoutError):
        _client(fake.base_url, timeout=openai.Timeout(0.3, connect=WAIT)).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    reservation = only_reservation()
    assert fake.requests, "the request was sent before the timeout"
    assert reservation.state == "uncertain"
    assert tenant_counter().reserved == reservation.amount
    assert_conserved()


def test_a_connection_lost_mid_stream_keeps_the_hold_counted(fake: FakeOpenAI) -> None:
    fake.then(kind="drop", chunks=6)
    stream = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True
    )
    with pytest.raises(openai.APIConnectionError):
        for _ in stream:
            pass
    assert only_reservation().state == "uncertain"
    assert_conserved()


# -- streams -----------------------------------------------------------------------------------


def test_a_stream_asks_for_usage_and_is_charged_the_final_usage(fake: FakeOpenAI) -> None:
    stream = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True
    )
    assert isinstance(stream, openai.Stream)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello from the fake. " * 3
    assert fake.last.body["stream_options"] == {"include_usage": True}
    line = charge_line(only_reservation())
    assert (line.input_tokens, line.output_tokens, line.cost) == (20, 12, Decimal("41.5"))
    assert_conserved()


def test_a_responses_stream_is_charged_the_completed_usage(fake: FakeOpenAI) -> None:
    stream = _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
        model=GPT, input="hi", max_output_tokens=100, stream=True
    )
    kinds = [event.type for event in stream]
    assert kinds[-1] == "response.completed"
    assert charge_line(only_reservation()).output_tokens == 12


def test_breaking_out_of_a_stream_closes_upstream_and_charges_what_was_produced(
    fake: FakeOpenAI,
) -> None:
    fake.then(chunks=200, delay=0.02)
    stream = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    for received, _chunk in enumerate(stream, start=1):
        if received == 2:
            break
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    assert fake.last.chunks_sent < 200
    reservation = only_reservation()
    line = charge_line(reservation)
    per_delta = len(openai_tokens("Hello from the fake. "))
    assert line.output_tokens == 2 * per_delta  # counted from the deltas: not 0, not 1000
    assert line.input_tokens == reservation.input_tokens
    assert reservation.state == "committed"
    assert_conserved()


def test_closing_a_stream_closes_upstream_and_settles(fake: FakeOpenAI) -> None:
    fake.then(chunks=200, delay=0.02)
    with _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    ) as stream:
        next(stream)
    assert fake.last.client_closed.wait(WAIT)
    assert charge_line(only_reservation()).output_tokens == len(
        openai_tokens("Hello from the fake. ")
    )
    assert_conserved()


def test_a_kill_switch_tripped_mid_stream_stops_it(fake: FakeOpenAI) -> None:
    fake.then(chunks=300, delay=0.02)
    stream = _client(fake.base_url, switch_check_seconds=0.1).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )

    def consume() -> None:
        for received, _chunk in enumerate(stream, start=1):
            if received == 1:
                budgets.trip(tenant="acme", reason="cost spike")

    with pytest.raises(KillSwitchActive, match="cost spike"):
        consume()
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    assert fake.last.chunks_sent < 300
    line = charge_line(only_reservation())
    assert 0 < line.output_tokens < 1000
    assert_conserved()


@pytest.mark.django_db(transaction=True)
def test_a_kill_switch_stops_a_stalled_sync_stream_within_the_bound(fake: FakeOpenAI) -> None:
    # Committed rows (transaction=True): the watchdog reads switches on its own connection.
    fake.then(chunks=50, stall_after=1)
    stream = _client(fake.base_url, switch_check_seconds=0.1).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    tripped_at = 0.0

    def consume() -> None:
        nonlocal tripped_at
        for _chunk in stream:
            if not tripped_at:
                budgets.trip(tenant="acme", reason="stalled spend")
                tripped_at = time.monotonic()

    with pytest.raises(KillSwitchActive, match="stalled spend"):
        consume()
    assert time.monotonic() - tripped_at < WAIT
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    assert fake.last.chunks_sent == 1  # stalled: no chunk came to trigger the stream's own look
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert 0 < charge_line(reservation).output_tokens < 1000
    assert_conserved()


def test_the_degraded_model_and_ceiling_are_what_is_sent(fake: FakeOpenAI) -> None:
    Plan.objects.create(
        name="degrading",
        degradation_ladder=[{"at_percent": 50, "models": {GPT: GPT_MINI}, "max_output_tokens": 40}],
    )
    budgets.ensure_tenant("acme", plan="degrading")
    budgets.set_limit(tenant="acme", amount=Decimal("1000"), window="month")
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=0, max_output_tokens=300
    )
    _client(fake.base_url, allow_degrade=True).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert (fake.last.body["model"], fake.last.body["max_completion_tokens"]) == (GPT_MINI, 40)
    degraded = Reservation.objects.get(degraded=True)
    assert (degraded.model, degraded.requested_model, degraded.state) == (
        GPT_MINI,
        GPT,
        "committed",
    )
    assert charge_line(degraded).model == GPT_MINI


def test_a_dated_name_is_degraded_by_the_ladder_of_its_model(fake: FakeOpenAI) -> None:
    Plan.objects.create(
        name="degrading", degradation_ladder=[{"at_percent": 50, "models": {GPT: GPT_MINI}}]
    )
    budgets.ensure_tenant("acme", plan="degrading")
    budgets.set_limit(tenant="acme", amount=Decimal("1000"), window="month")
    client = _client(fake.base_url, allow_degrade=True)
    client.chat.completions.create(  # type: ignore[attr-defined]
        model="gpt-4o-2024-08-06", messages=MESSAGES, max_completion_tokens=10
    )
    assert fake.last.body["model"] == "gpt-4o-2024-08-06"  # below the rung: as spelled
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=0, max_output_tokens=300
    )
    client.chat.completions.create(  # type: ignore[attr-defined]
        model="gpt-4o-2024-08-06", messages=MESSAGES, max_completion_tokens=10
    )
    assert fake.last.body["model"] == GPT_MINI
    degraded = Reservation.objects.get(degraded=True)
    assert (degraded.requested_model, degraded.model) == ("gpt-4o-2024-08-06", GPT_MINI)


# -- async -------------------------------------------------------------------------------------


def test_the_async_client_is_guarded(fake: FakeOpenAI) -> None:
    client = _async_client(fake.base_url)

    async def call() -> object:
        return await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )

    async_to_sync(call)()
    assert charge_line(only_reservation()).cost == Decimal("41.5")
    assert_conserved()


def test_an_async_stream_is_charged_its_final_usage(fake: FakeOpenAI) -> None:
    client = _async_client(fake.base_url)

    async def call() -> str:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True
        )
        assert isinstance(stream, openai.AsyncStream)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert async_to_sync(call)() == "Hello from the fake. " * 3
    assert charge_line(only_reservation()).output_tokens == 12


def test_a_cancelled_async_task_closes_upstream_and_charges_what_was_produced(
    fake: FakeOpenAI,
) -> None:
    fake.then(chunks=300, delay=0.02)
    client = _async_client(fake.base_url)

    async def consume(first: asyncio.Event) -> None:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
        )
        async for _ in stream:
            first.set()

    async def main() -> None:
        first = asyncio.Event()
        task = asyncio.create_task(consume(first))
        await asyncio.wait_for(first.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(main)()
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert 0 < charge_line(reservation).output_tokens < 1000
    assert_conserved()


def test_a_kill_switch_stops_a_stalled_async_stream_within_the_bound(fake: FakeOpenAI) -> None:
    fake.then(chunks=50, stall_after=1)
    client = _async_client(fake.base_url, switch_check_seconds=0.1)

    async def consume() -> float:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
        )
        tripped_at = 0.0
        try:
            async for _ in stream:
                if not tripped_at:
                    await sync_to_async(budgets.trip)(tenant="acme", reason="stalled spend")
                    tripped_at = time.monotonic()
        except KillSwitchActive:
            return time.monotonic() - tripped_at
        raise AssertionError("the stream ended without the kill switch stopping it")

    noticed_after = async_to_sync(consume)()
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    assert fake.last.chunks_sent == 1  # stalled: no chunk arrived to trigger the check
    assert noticed_after < WAIT
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert 0 < charge_line(reservation).output_tokens < 1000
    assert_conserved()


def test_an_async_refusal_sends_nothing(fake: FakeOpenAI) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("10"), window="month")
    client = _async_client(fake.base_url)

    async def call() -> object:
        return await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )

    with pytest.raises(BudgetExceeded):
        async_to_sync(call)()
    assert fake.requests == []


def openai_tokens(text: str) -> list[int]:
    from llm_budgets.tokens import encoding, encoding_name

    name = encoding_name("openai", GPT)
    assert name is not None
    return encoding(name).encode(text)


def test_breaking_out_of_a_responses_stream_closes_upstream(fake: FakeOpenAI) -> None:
    fake.then(chunks=200, delay=0.02)
    stream = _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
        model=GPT, input="hi", max_output_tokens=1000, stream=True
    )
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    line = charge_line(only_reservation())
    assert line.output_tokens == len(openai_tokens("Hello from the fake. "))
    assert_conserved()
