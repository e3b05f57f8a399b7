"""The Anthropic guard, with the real ``anthropic`` package pointed at a fake Anthropic on
127.0.0.1: usage in Anthropic's shape (cache reads and writes, the 5-minute / 1-hour split, server
tools), ``messages.create`` and ``messages.stream()``, sync and async, and every way a call ends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import anthropic
import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, KillSwitchActive, UnknownPrice
from llm_budgets.integrations.anthropic import guard
from llm_budgets.integrations.guarding import NotGuarded, json_text
from llm_budgets.models import Reservation, UsageRecord
from llm_budgets.pricing.tokens import count_input_tokens
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.server import WAIT
from tests.factories import PRICES_START
from tests.integrations import (
    CLAUDE,
    assert_conserved,
    attribute_at,
    charge_line,
    only_reservation,
    seed_tenant,
    tenant_counter,
)

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
# 30 uncached x 1 + 100 cache reads x 0.5 + 30 5-minute writes x 1.25 + 20 1-hour writes x 2
# + 15 output x 2; a request that declares the web search tool also pays one search (10).
COST = Decimal(30 + 50 + Decimal("37.5") + 40 + 30)
SEARCH_FEE = Decimal(10)


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
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    message = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, system="Be brief.", messages=MESSAGES, tools=[search]
    )
    assert isinstance(message, anthropic.types.Message)
    assert fake.last.body["max_tokens"] == only_reservation().max_output_tokens == 100
    line = charge_line(only_reservation())
    assert (line.input_tokens, line.cached_input_tokens, line.cache_write_tokens) == (180, 100, 50)
    assert (line.cache_write_1h_tokens, line.output_tokens) == (20, 15)
    assert line.tool_calls == {"web_search": 1}
    assert line.cost == COST + SEARCH_FEE
    assert (tenant_counter().spent, tenant_counter().reserved) == (COST + SEARCH_FEE, 0)
    assert_conserved()


def test_server_web_search_is_held_at_max_uses(fake: FakeAnthropic) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("1000000"), window="month")
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
    upload = {"type": "container_upload", "file_id": "file_1"}
    with pytest.raises(InvalidUsage, match="only text can be counted"):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=[{"role": "user", "content": [upload]}]
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


# -- deny by default (issue 32) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "with_middleware",
        "post",
        "request",
        "beta.agents",
        "beta.messages.tool_runner",
        "beta.messages.batches",
        "skills",
    ],
)
def test_middleware_raw_http_and_unpriced_paths_are_refused(fake: FakeAnthropic, path: str) -> None:
    with pytest.raises(NotGuarded):
        attribute_at(_client(fake.base_url), path)
    assert fake.requests == []


@pytest.mark.parametrize(
    "block",
    [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {"type": "document", "source": {"type": "file", "file_id": "file_1"}},
    ],
)
def test_a_pdf_by_reference_in_a_tool_result_is_refused_before_sending(
    fake: FakeAnthropic, block: dict[str, object]
) -> None:
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "tu_1", "name": "fetch", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [block]}],
        },
    ]
    with pytest.raises(InvalidUsage, match="Send the PDF inline"):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=messages, tools=[TOOL]
        )
    assert fake.requests == []


TOOL = {"name": "fetch", "description": "Fetch a page.", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(("tool_choice", "added"), [(None, 346), ({"type": "any"}, 313)])
def test_the_tool_use_system_prompt_is_held(
    fake: FakeAnthropic, tool_choice: dict[str, str] | None, added: int
) -> None:
    extra = {"tool_choice": tool_choice} if tool_choice else {}
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, tools=[TOOL], **extra
    )
    counted = count_input_tokens(
        provider="anthropic",
        model=CLAUDE,
        messages=[
            {"role": "user", "content": "Say hello."},
            {"role": "system", "content": json_text([TOOL])},
        ],
    )
    assert only_reservation().input_tokens == counted + added


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, NotGuarded),
        (
            {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2}]},
            InvalidUsage,
        ),
        ({"inference_geo": "eu"}, NotGuarded),
        ({"speed": "turbo"}, NotGuarded),
        ({"container": "cntr_1"}, NotGuarded),
    ],
)
def test_unpriced_tools_and_premiums_are_refused_before_sending(
    fake: FakeAnthropic, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES, **kwargs
        )
    assert fake.requests == []


def test_fast_mode_is_charged_at_its_multiplier_or_the_prices_own_fast_rates(
    fake: FakeAnthropic,
) -> None:
    client = _client(fake.base_url)
    fake.usage = {"input_tokens": 30, "output_tokens": 15, "speed": "fast"}
    none = override_settings(LLM_BUDGETS={"SERVICE_TIER_MULTIPLIERS": {"anthropic": {}}})
    with none, pytest.raises(UnknownPrice, match="fast"):  # neither listed nor multiplied
        client.messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES, speed="fast"
        )
    assert fake.requests == []
    client.messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, speed="fast"
    )
    first = Reservation.objects.get()
    assert first.service_tier == "fast"
    assert charge_line(first).cost == (30 * 1 + 15 * 2) * 6  # the published multiplier
    budgets.set_price(
        provider="anthropic",
        model=CLAUDE,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(2000000),
        service_tiers={"fast": {"input_per_mtok": "5000000", "output_per_mtok": "11000000"}},
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    client.messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, speed="fast"
    )
    assert fake.last.body["speed"] == "fast"
    line = charge_line(Reservation.objects.exclude(pk=first.pk).get())
    assert line.cost == 30 * 5 + 15 * 11  # the price's own fast rates win over the multiplier
    assert_conserved()


def test_priority_capacity_used_under_auto_is_left_uncertain(fake: FakeAnthropic) -> None:
    fake.usage = {"input_tokens": 30, "output_tokens": 15, "service_tier": "priority"}
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES
    )
    assert only_reservation().state == "uncertain"
    assert_conserved()


# -- thinking ----------------------------------------------------------------------------------

THINKING = {"type": "enabled", "budget_tokens": 2000}


def test_leaving_a_thinking_stream_early_charges_the_held_ceiling(fake: FakeAnthropic) -> None:
    fake.then(chunks=200, delay=0.02)
    with _client(fake.base_url).messages.stream(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=4000, messages=MESSAGES, thinking=THINKING
    ) as stream:
        for _event in stream:
            break
    assert fake.last.client_closed.wait(WAIT)
    # Claude streams a summary of its thinking and bills all of it: the ceiling, not the summary.
    line = charge_line(only_reservation())
    assert line.output_tokens == 4000
    assert_conserved()


def test_an_early_stop_is_charged_at_most_the_ceiling_it_was_sent_with(
    fake: FakeAnthropic,
) -> None:
    fake.then(chunks=50, text="x" * 400)
    stream = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=20, messages=MESSAGES, stream=True
    )
    for received, _event in enumerate(stream):
        if received == 4:
            break
    line = charge_line(only_reservation())
    assert line.output_tokens == 20  # 1,200 bytes counted conservatively, capped at max_tokens
    assert_conserved()


def test_a_thinking_budget_stays_below_a_clamped_max_tokens(fake: FakeAnthropic) -> None:
    budgets.set_price(
        provider="anthropic",
        model=CLAUDE,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(2000000),
        max_output_tokens=3000,
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE,
        max_tokens=8000,
        messages=MESSAGES,
        thinking={**THINKING, "budget_tokens": 6000},
    )
    sent = fake.last.body
    assert sent["max_tokens"] == 3000
    assert sent["thinking"]["budget_tokens"] == 2999


def test_thinking_blocks_passed_back_are_accepted_and_counted(fake: FakeAnthropic) -> None:
    thinking = {"type": "thinking", "thinking": "The user wants a page.", "signature": "sig"}
    tool_use = {"type": "tool_use", "id": "tu_1", "name": "fetch", "input": {"url": "x"}}
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": "<html>hi</html>"}
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE,
        max_tokens=4000,
        thinking=THINKING,
        tools=[TOOL],
        messages=[
            *MESSAGES,
            {"role": "assistant", "content": [thinking, tool_use]},
            {"role": "user", "content": [result]},
        ],
    )
    assert fake.last.body["messages"][1]["content"][0]["type"] == "thinking"
    assert only_reservation().state == "committed"


def test_the_sdks_retry_after_an_overload_runs_under_a_hold_of_its_own(
    fake: FakeAnthropic,
) -> None:
    fake.then(kind="status", status=529)
    sdk = anthropic.Anthropic(base_url=fake.base_url, api_key="sk-test", max_retries=1)
    guard(sdk, tenant="acme").messages.create(model=CLAUDE, max_tokens=100, messages=MESSAGES)
    states = list(Reservation.objects.order_by("created_at").values_list("state", flat=True))
    assert states == ["released", "committed"]
    assert len(fake.requests) == 2
    assert_conserved()


def test_a_stream_served_from_priority_capacity_is_left_uncertain(fake: FakeAnthropic) -> None:
    fake.usage = {"input_tokens": 30, "output_tokens": 15, "service_tier": "priority"}
    stream = _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, stream=True
    )
    list(stream)
    assert only_reservation().state == "uncertain"
    assert_conserved()


def test_the_async_stream_helper_retries_under_a_hold_per_attempt(fake: FakeAnthropic) -> None:
    fake.then(kind="status", status=529)
    sdk = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="sk-test", max_retries=1)
    client = guard(sdk, tenant="acme")

    async def call() -> str:
        async with client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        ) as stream:
            return "".join([text async for text in stream.text_stream])

    assert async_to_sync(call)() == "Hello from the fake. " * 3
    states = list(Reservation.objects.order_by("created_at").values_list("state", flat=True))
    assert states == ["released", "committed"]
    assert_conserved()


def _png(width: int, height: int) -> str:
    """A real PNG of that size (one colour), base64."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x00\x00\x00" * width for _ in range(height))
    raw = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return base64.b64encode(raw).decode()


def test_inline_images_are_held_by_anthropics_published_rule_tool_results_included(
    fake: FakeAnthropic,
) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": _png(300, 200)},
    }
    tool_use = {"type": "tool_use", "id": "tu_1", "name": "fetch", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": [image]}
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE,
        max_tokens=100,
        messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "Say hello."}]},
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [{**result, "content": []}]},
        ],
    )
    _client(fake.base_url).messages.create(  # type: ignore[attr-defined]
        model=CLAUDE,
        max_tokens=100,
        messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "Say hello."}]},
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [result]},
        ],
    )
    without, with_result = Reservation.objects.order_by("created_at")
    # The first image is in both; the tool result's adds the larger of 300 x 200 / 750 = 80
    # and the 28 px patches of newer models, 11 x 8 = 88 tokens.
    assert with_result.input_tokens == without.input_tokens + 88
    assert fake.last.body["messages"][2]["content"][0]["content"][0]["type"] == "image"


def test_count_tokens_passes_through_and_diagnostics_is_refused(fake: FakeAnthropic) -> None:
    client = _client(fake.base_url)
    assert client.messages.count_tokens == client._target.messages.count_tokens  # type: ignore[attr-defined]
    with pytest.raises(NotGuarded, match="diagnostics"):
        client.messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=10, messages=MESSAGES, diagnostics={"x": 1}
        )
    assert fake.requests == []
