"""The Anthropic guard, with the real ``anthropic`` package pointed at a fake Anthropic on
127.0.0.1: usage in Anthropic's shape (cache reads and writes, the 5-minute / 1-hour split, server
tools), ``messages.create`` and ``messages.stream()``, sync and async, and every way a call ends."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import anthropic
import pytest
from asgiref.sync import async_to_sync

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, KillSwitchActive
from llm_budgets.integrations.anthropic import guard
from llm_budgets.integrations.guarding import NotGuarded
from llm_budgets.models import Reservation, UsageRecord
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.server import WAIT
from tests.integrations import (
    CLAUDE,
    assert_conserved,
    charge_line,
    only_reservation,
    seed_tenant,
    tenant_counter,
)

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
# 30 uncached x 1 + 100 cache reads x 0.5 + 30 5-minute writes x 1.25 + 20 1-hour writes x 2
# + 15 output x 2 + one web search (10)
COST = Decimal(30 + 50 + Decimal("37.5") + 40 + 30 + 10)


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    seed_tenant()
    server = FakeAnthropic()
    yield server
    server.stop()


def _client(base_url: str, *, timeout: object = WAIT, **guard_kwargs: object) -> object:
    sdk = anthropic.Anthropic(base_url=base_url, api_key="sk-test", max_retries=0, timeout=timeout)
    return guard(sdk, tenant="acme", end_user="u-1", **guard_kwargs)  # type: ignore[arg-type]


def test_a_message_is_charged_anthropic_usage_with_cache_and_tools(fake: FakeAnthropic) -> None:
    message = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, system="Be brief.", messages=MESSAGES
    )
    assert isinstance(message, anthropic.types.Message)
    assert fake.last.body["max_tokens"] == only_reservation().max_output_tokens == 100
    line = charge_line(only_reservation())
    assert (line.input_tokens, line.cached_input_tokens, line.cache_write_tokens) == (180, 100, 50)
    assert (line.cache_write_1h_tokens, line.output_tokens) == (20, 15)
    assert line.tool_calls == {"web_search": 1}
    assert line.cost == COST
    assert (tenant_counter().spent, tenant_counter().reserved) == (COST, 0)
    assert_conserved()


def test_server_web_search_is_held_at_max_uses(fake: FakeAnthropic) -> None:
    client = _client(fake.base_url)
    search = {"type": "web_search_20250305", "name": "web_search"}
    with pytest.raises(InvalidUsage, match="max_uses"):
        client.messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES, tools=[search]
        )
    assert fake.requests == []
    client.messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, tools=[{**search, "max_uses": 4}]
    )
    reservation = only_reservation()
    quote = budgets.quote(
        tenant="acme",
        provider="anthropic",
        model=CLAUDE,
        input_tokens=reservation.input_tokens,
        max_output_tokens=100,
        max_tool_calls={"web_search": 4},
    )
    assert reservation.amount == quote.estimate.amount
    assert charge_line(reservation).tool_calls == {"web_search": 1}
    assert_conserved()


def test_a_refusal_sends_nothing(fake: FakeAnthropic) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("1"), window="month")
    with pytest.raises(BudgetExceeded):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        )
    assert fake.requests == []
    assert Reservation.objects.count() == 0


def test_content_that_cannot_be_counted_offline_is_refused_before_sending(
    fake: FakeAnthropic,
) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    with pytest.raises(InvalidUsage, match="only text can be counted"):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=[{"role": "user", "content": [image]}]
        )
    assert fake.requests == []


def test_batches_are_refused_as_not_guarded(fake: FakeAnthropic) -> None:
    with pytest.raises(NotGuarded, match="batches"):
        _client(fake.base_url).messages.batches  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize(
    ("status", "state"), [(529, "released"), (429, "released"), (500, "uncertain")]
)
def test_provider_errors(fake: FakeAnthropic, status: int, state: str) -> None:
    fake.then(kind="status", status=status)
    with pytest.raises(anthropic.APIStatusError):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        )
    assert only_reservation().state == state
    assert UsageRecord.objects.count() == 0
    assert_conserved()


def test_a_timeout_is_uncertain(fake: FakeAnthropic) -> None:
    fake.then(kind="stall")
    with pytest.raises(anthropic.APITimeoutError):
        _client(fake.base_url, timeout=anthropic.Timeout(0.3, connect=WAIT)).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        )
    assert only_reservation().state == "uncertain"
    assert tenant_counter().reserved == only_reservation().amount


def test_a_raw_stream_is_charged_message_start_and_delta_usage(fake: FakeAnthropic) -> None:
    stream = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, stream=True
    )
    assert isinstance(stream, anthropic.Stream)
    kinds = [event.type for event in stream]
    assert (kinds[0], kinds[-1]) == ("message_start", "message_stop")
    line = charge_line(only_reservation())
    assert (line.input_tokens, line.output_tokens, line.cost) == (180, 15, COST)
    assert_conserved()


def test_messages_stream_helper_text_and_final_message(fake: FakeAnthropic) -> None:
    with _client(fake.base_url).messages.stream(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello from the fake. " * 3
    assert final.usage.output_tokens == 15
    assert charge_line(only_reservation()).cost == COST
    assert_conserved()


def test_leaving_the_stream_helper_early_closes_upstream_and_charges_what_was_produced(
    fake: FakeAnthropic,
) -> None:
    fake.then(chunks=200, delay=0.02)
    with _client(fake.base_url).messages.stream(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=1000, messages=MESSAGES
    ) as stream:
        for _text in stream.text_stream:
            break
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    assert fake.last.chunks_sent < 200
    line = charge_line(only_reservation())
    # Input as message_start reported it; output counted from the one delta received (the
    # conservative bound for a non-OpenAI tokenizer), never the whole ceiling.
    assert line.input_tokens == 180
    assert 0 < line.output_tokens < 1000
    assert_conserved()


def test_a_kill_switch_mid_stream(fake: FakeAnthropic) -> None:
    fake.then(chunks=300, delay=0.02)
    stream = _client(fake.base_url, switch_check_seconds=0.1).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=1000, messages=MESSAGES, stream=True
    )

    def consume() -> None:
        for event in stream:
            if event.type == "content_block_delta":
                budgets.trip(provider="anthropic", reason="provider incident")

    with pytest.raises(KillSwitchActive):
        consume()
    assert fake.last.client_closed.wait(WAIT)
    assert only_reservation().state == "committed"
    assert_conserved()


def test_the_async_client_and_its_stream_helper(fake: FakeAnthropic) -> None:
    sdk = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    client = guard(sdk, tenant="acme", end_user="u-1")

    async def call() -> str:
        await client.messages.create(model=CLAUDE, max_tokens=100, messages=MESSAGES)
        async with client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        ) as stream:
            return "".join([text async for text in stream.text_stream])

    assert async_to_sync(call)() == "Hello from the fake. " * 3
    lines = UsageRecord.objects.filter(kind="charge")
    assert [line.cost for line in lines] == [COST, COST]
    assert_conserved()


def test_leaving_the_async_stream_helper_early_closes_upstream(fake: FakeAnthropic) -> None:
    fake.then(chunks=200, delay=0.02)
    sdk = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    client = guard(sdk, tenant="acme", end_user="u-1")

    async def call() -> None:
        async with client.messages.stream(
            model=CLAUDE, max_tokens=1000, messages=MESSAGES
        ) as stream:
            async for _text in stream.text_stream:
                break

    async_to_sync(call)()
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    reservation = only_reservation()
    assert reservation.state == "committed"
    line = charge_line(reservation)
    assert line.input_tokens == 180
    assert 0 < line.output_tokens < 1000
    assert_conserved()


def test_a_connection_lost_mid_stream_is_uncertain(fake: FakeAnthropic) -> None:
    fake.then(kind="drop", chunks=8)
    stream = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, stream=True
    )
    # This SDK lets the HTTP client's own error through mid-stream (OpenAI's wraps it).
    with pytest.raises(Exception, match=r"peer closed connection|Connection error"):
        list(stream)
    assert only_reservation().state == "uncertain"
    assert tenant_counter().reserved == only_reservation().amount
    assert_conserved()
