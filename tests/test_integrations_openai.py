"""The OpenAI guard, with the real ``openai`` package pointed at a fake OpenAI on 127.0.0.1: every
way a call ends, and the ledger and counters after each."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import openai
import pydantic
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.engine import settlement
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    KillSwitchActive,
    LedgerUnavailable,
    OutputCeilingRequired,
    UnknownPrice,
)
from llm_budgets.integrations.guarding import (
    CODE_OUTPUT_TOKENS_PER_USE,
    SEARCH_CONTENT_TOKENS_PER_USE,
    NotGuarded,
    json_text,
)
from llm_budgets.integrations.openai import guard
from llm_budgets.models import Plan, Reservation, UsageRecord
from llm_budgets.pricing.tokens import count_input_tokens
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT, Behaviour
from llm_budgets.usage import input_allowed
from tests.factories import PRICES_START
from tests.integrations import (
    GPT,
    GPT_MINI,
    assert_conserved,
    attribute_at,
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
    budgets.ensure_tenant(tenant="acme", plan="defaults")
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

    monkeypatch.setattr(settlement, "reservation_commit_provider_usage", ledger_down)
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
    budgets.set_limit(tenant="acme", amount=Decimal("1000000"), window="month")
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


def test_extra_body_cannot_give_a_parameter_twice(fake: FakeOpenAI) -> None:
    with pytest.raises(InvalidUsage, match="max_completion_tokens given both"):
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
    with pytest.raises(NotGuarded, match="images"):
        client.images.generate(model="gpt-image-1", prompt="x")  # type: ignore[attr-defined]
    with pytest.raises(NotGuarded):
        client.chat.completions.with_raw_response  # type: ignore[attr-defined]  # noqa: B018
    assert client.files is client._target.files  # type: ignore[attr-defined]
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
    # A ceiling above all 300 chunks' tokens: the charge is what was produced, never the
    # ceiling, however many chunks a slow consumer read before the switch was noticed.
    stream = _client(fake.base_url, switch_check_seconds=0.1).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=4000, stream=True
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
    per_chunk = count_input_tokens(provider="openai", model=GPT, prompt=Behaviour().text)
    assert 0 < line.output_tokens <= per_chunk * fake.last.chunks_sent < 4000
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
    budgets.ensure_tenant(tenant="acme", plan="degrading")
    budgets.set_limit(tenant="acme", amount=Decimal("3000"), window="month")
    # 600 output tokens and 256 of input tolerance at 2 a token (the dearest input-side rate):
    # 1712 held, past the rung at 50%.
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=0, max_output_tokens=600
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
    budgets.ensure_tenant(tenant="acme", plan="degrading")
    budgets.set_limit(tenant="acme", amount=Decimal("3000"), window="month")
    client = _client(fake.base_url, allow_degrade=True)
    client.chat.completions.create(  # type: ignore[attr-defined]
        model="gpt-4o-2024-08-06", messages=MESSAGES, max_completion_tokens=10
    )
    assert fake.last.body["model"] == "gpt-4o-2024-08-06"  # below the rung: as spelled
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=0, max_output_tokens=600
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
    from llm_budgets.pricing.tokens import encoding, encoding_name

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


# -- deny by default (issue 32) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "post",
        "request",
        "get",
        "containers",
        "vector_stores",
        "responses.compact",
        "responses.connect",
        "with_raw_response",
    ],
)
def test_raw_http_and_unpriced_resources_are_refused(fake: FakeOpenAI, path: str) -> None:
    with pytest.raises(NotGuarded):
        attribute_at(_client(fake.base_url), path)
    assert fake.requests == []


def test_free_resources_and_configuration_pass_through(fake: FakeOpenAI) -> None:
    client = _client(fake.base_url)
    assert client.models is client._target.models  # type: ignore[attr-defined]
    assert client.responses.input_tokens is client._target.responses.input_tokens  # type: ignore[attr-defined]
    assert client.api_key == "sk-test"  # type: ignore[attr-defined]


def test_a_background_response_is_refused_before_sending(fake: FakeOpenAI) -> None:
    with pytest.raises(NotGuarded, match="background"):
        _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
            model=GPT, input="a long task", max_output_tokens=100, background=True
        )
    assert fake.requests == []
    assert Reservation.objects.count() == 0
    _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
        model=GPT, input="a short task", max_output_tokens=100, background=False
    )
    assert only_reservation().state == "committed"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_file", "file_url": "https://example.com/report.pdf"},
        {"type": "input_image", "image_url": "https://example.com/chart.png"},
    ],
)
def test_a_file_or_image_in_a_tool_result_is_refused_before_sending(
    fake: FakeOpenAI, part: dict[str, str]
) -> None:
    tool_output = {"type": "function_call_output", "call_id": "call_1", "output": [part]}
    with pytest.raises(InvalidUsage, match="tool result"):
        _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
            model=GPT,
            input=[{"role": "user", "content": "read it"}, tool_output],
            max_output_tokens=100,
        )
    assert fake.requests == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ],
)
def test_audio_is_refused_before_sending(
    fake: FakeOpenAI, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(NotGuarded, match=match):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=10, **kwargs
        )
    assert fake.requests == []


# -- tiers -------------------------------------------------------------------------------------


def test_priority_without_rates_is_held_at_its_multiplier_or_refused_without_one(
    fake: FakeOpenAI,
) -> None:
    none = override_settings(LLM_BUDGETS={"SERVICE_TIER_MULTIPLIERS": {}})
    with none, pytest.raises(UnknownPrice, match="priority"):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier="priority"
        )
    assert fake.requests == []
    fake.service_tier = "priority"
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier="priority"
    )
    reservation = only_reservation()
    # The dearest input-side rate (the 1-hour cache write, 2) and the output rate (2), doubled.
    assert reservation.amount == 2 * (2 * input_allowed(reservation.input_tokens) + 2 * 100)
    assert charge_line(reservation).cost == 2 * Decimal("41.5")  # the published multiplier
    assert_conserved()


def test_priority_is_held_and_charged_at_the_price_tables_tier_rates(fake: FakeOpenAI) -> None:
    budgets.set_price(
        provider="openai",
        model=GPT,
        input_per_mtok=Decimal(1000000),
        cached_input_per_mtok=Decimal(500000),
        output_per_mtok=Decimal(2000000),
        service_tiers={
            "priority": {
                "input_per_mtok": "1700000",
                "cached_input_per_mtok": "850000",
                "output_per_mtok": "3400000",
            }
        },
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    fake.service_tier = "priority"
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier="priority"
    )
    reservation = only_reservation()
    assert reservation.service_tier == "priority"
    # The held input and its tolerance (issue #38) at the tier's input rate, and the ceiling.
    held_input = input_allowed(reservation.input_tokens)
    assert reservation.amount == Decimal("1.7") * held_input + Decimal("3.4") * 100
    line = charge_line(reservation)
    # 15 uncached x 1.7 + 5 cached x 0.85 + 12 output x 3.4 (standard: 41.5)
    assert line.cost == Decimal("70.55")
    assert line.service_tier == "priority"
    assert_conserved()


@pytest.mark.parametrize("tier", ["default", "auto"])
def test_standard_tiers_are_held_and_charged_at_the_versions_own_rates(
    fake: FakeOpenAI, tier: str
) -> None:
    fake.service_tier = "default" if tier == "auto" else tier
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier=tier
    )
    assert fake.last.body["service_tier"] == tier
    line = charge_line(only_reservation())
    # 15 uncached x 1 + 5 cached x 0.5 + 12 output x 2
    assert line.cost == Decimal("41.5")
    assert_conserved()


def test_flex_is_charged_at_flex_rates(fake: FakeOpenAI) -> None:
    fake.service_tier = "flex"
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier="flex"
    )
    line = charge_line(only_reservation())
    assert (line.cost, line.service_tier) == (Decimal("41.5") / 2, "flex")
    assert_conserved()


def test_an_answer_billed_at_the_projects_priority_default_is_charged_at_priority(
    fake: FakeOpenAI,
) -> None:
    fake.service_tier = "priority"  # the project's default tier, not asked for
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    reservation = only_reservation()
    line = charge_line(reservation)
    # The provider's bill: twice the standard 41.5, at the tier the answer names.
    assert (reservation.state, line.service_tier, line.cost) == ("committed", "priority", 83)
    assert line.overage == max(Decimal(0), line.cost - reservation.amount)
    assert_conserved()


def test_an_answer_billed_at_a_tier_nothing_prices_is_left_uncertain(fake: FakeOpenAI) -> None:
    fake.service_tier = "scale"  # no rates in the price, no multiplier
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    reservation = only_reservation()
    assert reservation.state == "uncertain"
    assert tenant_counter().reserved == reservation.amount
    assert_conserved()


# -- server tools ------------------------------------------------------------------------------


def test_file_search_and_code_interpreter_fees_are_held_per_allowed_call_and_charged_per_call(
    fake: FakeOpenAI,
) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("1000000"), window="month")
    budgets.set_price(
        provider="openai",
        model=GPT,
        input_per_mtok=Decimal(1000000),
        cached_input_per_mtok=Decimal(500000),
        output_per_mtok=Decimal(2000000),
        tool_fees={"file_search": "3", "code_interpreter": "30"},
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    tools = [
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
    ]
    client = _client(fake.base_url)
    with pytest.raises(InvalidUsage, match="max_tool_calls"):
        client.responses.create(model=GPT, input="q", tools=tools, max_output_tokens=50)  # type: ignore[attr-defined]
    client.responses.create(  # type: ignore[attr-defined]
        model=GPT, input="q", tools=tools, max_tool_calls=2, max_output_tokens=50
    )
    reservation = only_reservation()
    # Two file searches' results and two code outputs held as input (the guard's bounds), with
    # the fees.
    prompt = count_input_tokens(
        provider="openai",
        model=GPT,
        messages=[
            {"role": "user", "content": "q"},
            {"role": "system", "content": json_text(tools)},
        ],
    )
    assert reservation.input_tokens == (
        prompt + 2 * SEARCH_CONTENT_TOKENS_PER_USE + 2 * CODE_OUTPUT_TOKENS_PER_USE
    )
    assert reservation.amount == input_allowed(reservation.input_tokens) + 2 * 50 + 2 * 3 + 2 * 30
    line = charge_line(reservation)
    assert line.tool_calls == {"file_search": 1, "code_interpreter": 1}
    assert line.cost == Decimal("41.5") + 3 + 30
    assert_conserved()


def test_a_built_in_tool_the_guard_does_not_price_is_refused(fake: FakeOpenAI) -> None:
    with pytest.raises(NotGuarded, match="mcp"):
        _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
            model=GPT,
            input="q",
            tools=[{"type": "mcp", "server_label": "x", "server_url": "https://x"}],
            max_tool_calls=1,
            max_output_tokens=50,
        )
    assert fake.requests == []


# -- charging what may have been billed --------------------------------------------------------

REASONER = "o4-mini"


def _price_reasoner() -> None:
    budgets.set_price(
        provider="openai",
        model=REASONER,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(2000000),
        effective_from=PRICES_START,
    )


def test_breaking_out_of_a_reasoning_models_stream_charges_the_held_ceiling(
    fake: FakeOpenAI,
) -> None:
    _price_reasoner()
    fake.then(chunks=200, delay=0.02)
    stream = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=REASONER, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    for _chunk in stream:
        break
    assert fake.last.client_closed.wait(WAIT)
    # Reasoning tokens are never streamed: the visible text says nothing of what was billed.
    assert charge_line(only_reservation()).output_tokens == 1000
    assert_conserved()


@pytest.mark.parametrize(("model", "charged"), [(REASONER, 1000), (GPT, None)])
def test_a_stream_without_final_usage_is_charged_the_ceiling_on_a_reasoning_model(
    fake: FakeOpenAI, model: str, charged: int | None
) -> None:
    _price_reasoner()
    fake.then(usage=False)
    for _chunk in _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
        model=model, input="hi", max_output_tokens=1000, stream=True
    ):
        pass
    line = charge_line(only_reservation())
    expected = charged or 3 * len(openai_tokens("Hello from the fake. "))
    assert line.output_tokens == expected
    assert_conserved()


def test_the_sdks_retry_after_a_timeout_runs_under_a_hold_of_its_own(fake: FakeOpenAI) -> None:
    fake.then(kind="stall")
    sdk = openai.OpenAI(
        base_url=f"{fake.base_url}/v1",
        api_key="sk-test",
        max_retries=1,
        timeout=openai.Timeout(0.3, connect=WAIT),
    )
    response = guard(sdk, tenant="acme").chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert response.choices[0].message.content.startswith("Hello")
    assert len(fake.requests) == 2
    timed_out, answered = Reservation.objects.order_by("created_at")
    # The timed-out attempt may have been billed: it stays counted. The retry is charged.
    assert (timed_out.state, answered.state) == ("uncertain", "committed")
    assert tenant_counter().reserved == timed_out.amount
    assert_conserved()


def test_a_retried_rate_limit_releases_the_first_attempt(fake: FakeOpenAI) -> None:
    fake.then(kind="status", status=429)
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=2)
    guard(sdk, tenant="acme").chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    states = list(Reservation.objects.order_by("created_at").values_list("state", flat=True))
    assert states == ["released", "committed"]
    assert len(fake.requests) == 2
    assert_conserved()


def test_each_attempt_holds_under_an_idempotency_key_of_its_own(fake: FakeOpenAI) -> None:
    """The guard sends a key with every hold (issue #38): one per attempt, so the SDK's retry
    of a failed attempt is a hold of its own, never the first one replayed."""
    fake.then(kind="status", status=429)
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=1)
    client = guard(sdk, tenant="acme")
    for _ in range(2):
        client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    keys = list(
        Reservation.objects.order_by("created_at").values_list("idempotency_key", flat=True)
    )
    assert len(keys) == 3  # the 429'd attempt, its retry, the second call
    assert all(key and key.startswith("guard-") for key in keys)
    assert len(set(keys)) == 3


def test_an_attempts_own_key_is_not_looked_up_before_its_first_hold(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key was made for the attempt: its first admission cannot find it, so it costs no
    query (measured: the look-up was about a fifth of an in-process reserve)."""
    from llm_budgets.engine import admission

    looked: list[str] = []
    real = admission._reservation_with_key

    def counted(tenant_id: int, key: str) -> Reservation | None:
        looked.append(key)
        return real(tenant_id, key)

    monkeypatch.setattr(admission, "_reservation_with_key", counted)
    _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert looked == []
    assert only_reservation().idempotency_key.startswith("guard-")  # type: ignore[union-attr]


def _answer_lost_once(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[object], list[float], list[bool]]:
    """Admission takes its hold, then the ledger's answer is lost once (``LedgerUnavailable``
    after the commit, as a connection cut after COMMIT): the keys each admission was asked
    with, the guard's waits (not slept) and each admission's ``new_key``."""
    from llm_budgets.engine import admission
    from llm_budgets.integrations import guarding

    real = admission.reservation_create
    asked: list[object] = []
    waits: list[float] = []
    new_keys: list[bool] = []

    def lost_once(**kwargs: object) -> Reservation:
        asked.append(kwargs.get("idempotency_key"))
        new_keys.append(bool(kwargs.get("new_key")))
        reservation = real(**kwargs)  # type: ignore[arg-type]
        if len(asked) == 1:
            raise LedgerUnavailable("The answer was lost.", retry_after=2)
        return reservation

    real_sleep = time.sleep

    def guards_wait(seconds: float) -> None:  # the guard's waits, recorded; others, slept
        if sys._getframe(1).f_globals["__name__"] == guarding.__name__:
            waits.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(admission, "reservation_create", lost_once)
    monkeypatch.setattr(time, "sleep", guards_wait)
    return asked, waits, new_keys


def test_an_admission_whose_answer_was_lost_is_asked_again_with_its_key(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its retry gets back the hold the lost answer took: one hold, one request, charged once
    (without the key the retry held again, and the first hold expired charged as estimated)."""
    asked, waits, new_keys = _answer_lost_once(monkeypatch)
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=1)
    guard(sdk, tenant="acme").chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert len(asked) == 2
    assert asked[0] == asked[1] == only_reservation().idempotency_key
    assert new_keys == [True, False]  # the retry looks its key up: that is how it finds the hold
    assert waits == [2.0]  # the refusal's retry_after
    assert only_reservation().state == "committed"
    assert len(fake.requests) == 1
    assert tenant_counter().reserved == 0
    assert_conserved()


def test_without_retries_a_lost_admission_answer_is_raised_before_anything_is_sent(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked, waits, _ = _answer_lost_once(monkeypatch)
    with pytest.raises(LedgerUnavailable):
        _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )
    assert (len(asked), waits, fake.requests) == (1, [], [])
    assert str(asked[0]).startswith("guard-")
    # The hold it took stays until it expires (its key is in the log line a retry would use).
    assert only_reservation().idempotency_key == asked[0]


def test_the_async_client_asks_admission_again_with_the_same_key(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_budgets.integrations import guarding

    asked, _, _ = _answer_lost_once(monkeypatch)
    waited: list[float] = []
    real_sleep = asyncio.sleep

    async def guards_wait(seconds: float) -> None:
        if sys._getframe(1).f_globals["__name__"] == guarding.__name__:
            waited.append(seconds)
        else:
            await real_sleep(seconds)

    monkeypatch.setattr(asyncio, "sleep", guards_wait)
    sdk = openai.AsyncOpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=1)
    client = guard(sdk, tenant="acme")

    async def call() -> object:
        return await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )

    async_to_sync(call)()
    assert len(asked) == 2
    assert asked[0] == asked[1]
    assert waited == [2.0]
    assert only_reservation().state == "committed"
    assert len(fake.requests) == 1


# -- what the caller sees ----------------------------------------------------------------------


def test_the_usage_chunk_the_guard_asked_for_is_hidden_from_a_caller_who_did_not(
    fake: FakeOpenAI,
) -> None:
    stream = _client(fake.base_url).chat.completions.create(  # type: ignore[attr-defined]
        model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)  # no IndexError
    assert text == "Hello from the fake. " * 3
    assert charge_line(only_reservation()).output_tokens == 12  # settled on the hidden usage


def test_include_usage_false_is_honoured_and_true_still_shows_the_usage_chunk(
    fake: FakeOpenAI,
) -> None:
    client = _client(fake.base_url)
    hidden = list(
        client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT,
            messages=MESSAGES,
            max_completion_tokens=100,
            stream=True,
            stream_options={"include_usage": False},
        )
    )
    assert all(chunk.choices for chunk in hidden)
    shown = list(
        client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT,
            messages=MESSAGES,
            max_completion_tokens=100,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert shown[-1].choices == []
    assert shown[-1].usage.completion_tokens == 12


def test_the_async_client_retries_under_a_hold_per_attempt(fake: FakeOpenAI) -> None:
    fake.then(kind="status", status=500)
    sdk = openai.AsyncOpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=1)
    client = guard(sdk, tenant="acme")

    async def call() -> object:
        return await client.chat.completions.create(  # type: ignore[attr-defined]
            model=GPT, messages=MESSAGES, max_completion_tokens=100
        )

    async_to_sync(call)()
    states = list(Reservation.objects.order_by("created_at").values_list("state", flat=True))
    # A 500 may follow generation: that attempt stays counted while the retry is charged.
    assert states == ["uncertain", "committed"]
    assert_conserved()


def test_with_options_max_retries_is_the_guards_and_the_sdk_sends_none(fake: FakeOpenAI) -> None:
    client = _client(fake.base_url).with_options(max_retries=3)  # type: ignore[attr-defined]
    assert client.max_retries == 0  # the SDK's own retries are off under the guard
    assert client._options.max_retries == 3
    assert client.copy()._options.max_retries == 3


@pytest.mark.parametrize(
    "kwargs",
    [{"context_management": [{"type": "compaction"}]}],
)
def test_second_model_runs_are_refused(fake: FakeOpenAI, kwargs: dict[str, object]) -> None:
    with pytest.raises(NotGuarded):
        _client(fake.base_url).responses.create(  # type: ignore[attr-defined]
            model=GPT, input="go on", max_output_tokens=10, **kwargs
        )
    assert fake.requests == []
