"""The OpenAI guard admits what can be bounded, at its worst case (issue #39 items 1 and 3): the
keys of ``extra_body`` as the same parameters, ``n`` choices, images, stored context, an omitted
ceiling, chat web search, predicted outputs, flex, the ``stream()`` helpers and embeddings. The
real ``openai`` client against the fake OpenAI on 127.0.0.1; prices in round numbers (a token of
input costs 1, of output 2: tests/integrations.py)."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import openai
import pytest
from asgiref.sync import async_to_sync

from llm_budgets import budgets
from llm_budgets.exceptions import InvalidUsage, OutputCeilingRequired
from llm_budgets.integrations.guarding import SEARCH_CONTENT_TOKENS_PER_USE, NotGuarded
from llm_budgets.integrations.images import openai_image_tokens
from llm_budgets.integrations.openai import guard
from llm_budgets.models import Reservation
from llm_budgets.pricing.tokens import count_input_tokens
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT, Behaviour, Seen
from llm_budgets.usage import input_allowed
from tests.factories import PRICES_START
from tests.integrations import (
    GPT,
    assert_conserved,
    charge_line,
    only_reservation,
    seed_tenant,
)

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "Say hello."}]
EMBEDDER = "text-embedding-3-small"


class FakeOpenAIWithEmbeddings(FakeOpenAI):
    """The fake, answering ``/embeddings`` as OpenAI does (one vector per input, usage)."""

    def answer_json(self, seen: Seen, behaviour: Behaviour) -> dict[str, Any]:
        if not seen.path.endswith("/embeddings"):
            return super().answer_json(seen, behaviour)
        given = seen.body["input"]
        count = 1 if isinstance(given, str) else len(given)
        return {
            "object": "list",
            "model": seen.body["model"],
            "data": [
                {"object": "embedding", "index": n, "embedding": [0.1, 0.2]} for n in range(count)
            ],
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        }


@pytest.fixture
def fake() -> Iterator[FakeOpenAIWithEmbeddings]:
    seed_tenant()
    budgets.set_limit(tenant="acme", amount=Decimal("10000000"), window="month")
    server = FakeOpenAIWithEmbeddings()
    yield server
    server.stop()


def _client(base_url: str) -> Any:
    sdk = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0, timeout=WAIT)
    return guard(sdk, tenant="acme", end_user="u-1")


def _async_client(base_url: str) -> Any:
    sdk = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0, timeout=WAIT
    )
    return guard(sdk, tenant="acme", end_user="u-1")


def _price_gpt(**fields: Any) -> None:
    """GPT's price again (1 a token in, 0.5 cached, 2 out) with ``fields`` added."""
    budgets.set_price(
        provider="openai",
        model=GPT,
        input_per_mtok=Decimal(1000000),
        cached_input_per_mtok=Decimal(500000),
        output_per_mtok=Decimal(2000000),
        tool_fees={"web_search": "10"},
        effective_from=PRICES_START + timedelta(seconds=1),
        **fields,
    )


def _held(input_tokens: int, output_tokens: int, fees: int = 0) -> Decimal:
    """What a hold at GPT's standard rates is: the input and its tolerance, the output, fees."""
    return Decimal(input_allowed(input_tokens)) + 2 * output_tokens + fees


def _counted(messages: list[dict[str, Any]]) -> int:
    return count_input_tokens(provider="openai", model=GPT, messages=messages)


# -- extra_body: its keys are the same parameters ----------------------------------------------


def test_an_unknown_extra_body_key_is_refused_before_sending(fake: FakeOpenAI) -> None:
    with pytest.raises(NotGuarded, match="surprise"):
        _client(fake.base_url).chat.completions.create(
            model=GPT, messages=MESSAGES, max_completion_tokens=50, extra_body={"surprise": 1}
        )
    assert fake.requests == []


def test_priority_in_extra_body_is_held_and_charged_as_priority(fake: FakeOpenAI) -> None:
    _price_gpt(
        service_tiers={"priority": {"input_per_mtok": "2000000", "output_per_mtok": "4000000"}}
    )
    fake.service_tier = "priority"
    _client(fake.base_url).chat.completions.create(
        model=GPT,
        messages=MESSAGES,
        max_completion_tokens=100,
        extra_body={"service_tier": "priority"},
    )
    reservation = only_reservation()
    assert reservation.service_tier == "priority"
    assert reservation.amount == 2 * _held(reservation.input_tokens, 100)
    assert fake.last.body["service_tier"] == "priority"
    # 15 uncached x 2 + 5 cached x 0.5 (the tier lists no cached rate) + 12 output x 4
    assert charge_line(reservation).cost == Decimal("80.5")
    assert_conserved()


def test_a_ceiling_in_extra_body_is_held_and_the_held_value_sent_there(fake: FakeOpenAI) -> None:
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, extra_body={"max_completion_tokens": 40}
    )
    assert only_reservation().max_output_tokens == 40
    assert fake.last.body["max_completion_tokens"] == 40


def test_stream_in_extra_body_is_refused(fake: FakeOpenAI) -> None:
    with pytest.raises(InvalidUsage, match="extra_body sets stream"):
        _client(fake.base_url).chat.completions.create(
            model=GPT, messages=MESSAGES, max_completion_tokens=50, extra_body={"stream": True}
        )
    assert fake.requests == []


def test_responses_stored_context_in_extra_body_is_held_like_the_parameter(
    fake: FakeOpenAI,
) -> None:
    _price_gpt(context_window=5000)
    _client(fake.base_url).responses.create(
        model=GPT,
        input="go on",
        max_output_tokens=50,
        extra_body={"previous_response_id": "resp_earlier"},
    )
    reservation = only_reservation()
    assert reservation.input_tokens == _counted([{"role": "user", "content": "go on"}]) + 5000
    assert fake.last.body["previous_response_id"] == "resp_earlier"


# -- n choices ---------------------------------------------------------------------------------


def test_n_choices_are_held_as_n_outputs_and_each_is_sent_its_share(fake: FakeOpenAI) -> None:
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=50, n=3
    )
    reservation = only_reservation()
    assert reservation.max_output_tokens == 150
    assert reservation.input_tokens == _counted(MESSAGES)  # the input once
    assert fake.last.body["max_completion_tokens"] == 50
    assert fake.last.body["n"] == 3
    assert reservation.state == "committed"


# -- images ------------------------------------------------------------------------------------


def _png(width: int, height: int) -> str:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    png = (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(header))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
    )
    return "data:image/png;base64," + base64.b64encode(png).decode()


@pytest.mark.parametrize(
    ("image", "tokens"),
    [
        ({"url": "https://example.com/x.png", "detail": "low"}, 85),
        ({"url": "https://example.com/x.png", "detail": "auto"}, 85 + 170 * 8),
        ({"url": "https://example.com/x.png"}, 85 + 170 * 8),
        ({"url": _png(1024, 1024), "detail": "high"}, 85 + 170 * 4),
        ({"url": _png(2048, 4096)}, 85 + 170 * 6),
    ],
)
def test_a_chat_image_is_held_at_the_most_its_detail_and_size_can_cost(
    fake: FakeOpenAI, image: dict[str, str], tokens: int
) -> None:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": image}]
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=[{"role": "user", "content": content}], max_completion_tokens=50
    )
    reservation = only_reservation()
    text_only = [{"role": "user", "content": "What is this?"}]
    assert reservation.input_tokens == _counted(text_only) + tokens
    assert fake.last.body["messages"][0]["content"][1]["type"] == "image_url"
    assert reservation.state == "committed"


def test_a_responses_input_image_is_held_by_the_same_rule(fake: FakeOpenAI) -> None:
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://example.com/x.png", "detail": "low"},
    ]
    _client(fake.base_url).responses.create(
        model=GPT, input=[{"role": "user", "content": content}], max_output_tokens=50
    )
    text_only = [{"role": "user", "content": "What is this?"}]
    assert only_reservation().input_tokens == _counted(text_only) + 85


def test_openai_image_rules_per_model_family() -> None:
    # gpt-4o-mini bills an image as many tokens as 33 gpt-4o tiles; patch models by patches.
    assert openai_image_tokens(model="gpt-4o-mini", detail="low", size=None) == 2833
    assert openai_image_tokens(model="gpt-4.1-mini", detail="low", size=(64, 64)) == 7  # 4 x 1.62
    assert openai_image_tokens(model="gpt-4.1-mini", detail="high", size=None) == 2489
    # A model the table does not know is held at the dearest rule.
    assert openai_image_tokens(model="my-deployment", detail="high", size=None) == 2833 + 5667 * 8


# -- stored context, omitted ceilings ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ],
)
def test_stored_context_is_held_at_the_models_context_window(
    fake: FakeOpenAI, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidUsage, match="context_window") as refused:
        _client(fake.base_url).responses.create(
            model=GPT, input="go on", max_output_tokens=50, **kwargs
        )
    assert refused.value.field == field
    assert fake.requests == []
    _price_gpt(context_window=5000)
    _client(fake.base_url).responses.create(
        model=GPT, input="go on", max_output_tokens=50, **kwargs
    )
    reservation = only_reservation()
    assert reservation.input_tokens >= 5000
    assert reservation.amount >= _held(5000, 50)
    assert reservation.state == "committed"
    assert_conserved()


def test_an_omitted_ceiling_holds_the_models_maximum_and_sends_none(fake: FakeOpenAI) -> None:
    _price_gpt(context_window=3000)
    _client(fake.base_url).chat.completions.create(model=GPT, messages=MESSAGES)
    reservation = only_reservation()
    assert reservation.max_output_tokens == 3000
    assert "max_completion_tokens" not in fake.last.body
    assert "max_tokens" not in fake.last.body
    assert reservation.state == "committed"


def test_an_omitted_ceiling_without_a_known_maximum_is_still_refused(fake: FakeOpenAI) -> None:
    with pytest.raises(OutputCeilingRequired):
        _client(fake.base_url).responses.create(model=GPT, input="hi")
    assert fake.requests == []


def test_an_async_omitted_ceiling_reads_the_maximum_outside_the_event_loop(
    fake: FakeOpenAI,
) -> None:
    _price_gpt(max_output_tokens=700, context_window=3000)

    async def call() -> None:
        await _async_client(fake.base_url).responses.create(model=GPT, input="hi")

    async_to_sync(call)()
    assert only_reservation().max_output_tokens == 700
    assert "max_output_tokens" not in fake.last.body


# -- chat web search, predicted outputs, flex --------------------------------------------------


def test_chat_web_search_is_held_its_fee_and_content_and_charged_its_fee(fake: FakeOpenAI) -> None:
    _price_gpt()  # no cache-write rates: input held at 1 a token
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=50, web_search_options={}
    )
    reservation = only_reservation()
    assert reservation.input_tokens == _counted(MESSAGES) + SEARCH_CONTENT_TOKENS_PER_USE
    assert reservation.max_tool_calls == {"web_search": 1}
    assert reservation.amount == _held(reservation.input_tokens, 50, fees=10)
    line = charge_line(reservation)
    assert line.tool_calls == {"web_search": 1}
    assert line.cost == Decimal("41.5") + 10
    assert_conserved()


def test_a_streamed_chat_web_search_is_charged_its_fee(fake: FakeOpenAI) -> None:
    stream = _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=50, web_search_options={}, stream=True
    )
    for _ in stream:
        pass
    assert charge_line(only_reservation()).cost == Decimal("41.5") + 10


def test_predicted_outputs_are_admitted_within_the_ceiling(fake: FakeOpenAI) -> None:
    prediction = {"type": "content", "content": "Hello there, friend."}
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=30, prediction=prediction
    )
    assert fake.last.body["max_completion_tokens"] == 30
    assert fake.last.body["prediction"] == prediction
    assert only_reservation().state == "committed"


def test_flex_is_held_and_charged_at_its_own_rates(fake: FakeOpenAI) -> None:
    _price_gpt(service_tiers={"flex": {"input_per_mtok": "500000", "output_per_mtok": "1000000"}})
    fake.service_tier = "flex"
    _client(fake.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=100, service_tier="flex"
    )
    reservation = only_reservation()
    assert reservation.service_tier == "flex"
    assert reservation.amount == _held(reservation.input_tokens, 100) / 2
    assert charge_line(reservation).cost == Decimal(20 * Decimal("0.5") + 12 * 1)


# -- the stream() helpers, embeddings, moderations ---------------------------------------------


def test_the_chat_stream_helper_is_guarded(fake: FakeOpenAI) -> None:
    with _client(fake.base_url).chat.completions.stream(
        model=GPT, messages=MESSAGES, max_completion_tokens=20
    ) as stream:
        text = "".join(
            event.delta for event in stream if getattr(event, "type", "") == "content.delta"
        )
    assert text
    reservation = only_reservation()
    assert fake.last.body["max_completion_tokens"] == 20 == reservation.max_output_tokens
    assert charge_line(reservation).cost == Decimal("41.5")
    assert_conserved()


def test_the_responses_stream_helper_is_guarded(fake: FakeOpenAI) -> None:
    with _client(fake.base_url).responses.stream(
        model=GPT, input="Say hello.", max_output_tokens=20
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text
    assert charge_line(only_reservation()).cost == Decimal("41.5")


def test_the_async_chat_stream_helper_is_guarded(fake: FakeOpenAI) -> None:
    async def call() -> None:
        async with _async_client(fake.base_url).chat.completions.stream(
            model=GPT, messages=MESSAGES, max_completion_tokens=20
        ) as stream:
            async for _ in stream:
                pass

    async_to_sync(call)()
    assert charge_line(only_reservation()).cost == Decimal("41.5")


def test_embeddings_are_held_and_charged_their_input(fake: FakeOpenAI) -> None:
    budgets.set_price(
        provider="openai",
        model=EMBEDDER,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(0),
        effective_from=PRICES_START,
    )
    answer = _client(fake.base_url).embeddings.create(model=EMBEDDER, input=["one", "two"])
    assert len(answer.data) == 2
    reservation = only_reservation()
    assert reservation.model == EMBEDDER
    line = charge_line(reservation)
    assert (line.input_tokens, line.output_tokens, line.cost) == (7, 0, Decimal(7))
    assert_conserved()


def test_embeddings_of_an_unpriced_model_are_refused_before_sending(fake: FakeOpenAI) -> None:
    with pytest.raises(Exception, match="text-embedding-3-large"):
        _client(fake.base_url).embeddings.create(model="text-embedding-3-large", input="x")
    assert fake.requests == []


def test_moderations_pass_through_unrefused(fake: FakeOpenAI) -> None:
    client = _client(fake.base_url)
    assert client.moderations is client._target.moderations


def test_a_project_whose_default_tier_is_priority_holds_calls_without_a_tier_at_it(
    fake: FakeOpenAI,
) -> None:
    _price_gpt(
        service_tiers={"priority": {"input_per_mtok": "2000000", "output_per_mtok": "4000000"}}
    )
    fake.service_tier = "priority"  # what the project's default bills
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=0)
    client = guard(sdk, tenant="acme", project_tier="priority")
    client.chat.completions.create(model=GPT, messages=MESSAGES, max_completion_tokens=50)
    reservation = only_reservation()
    assert reservation.service_tier == "priority"
    assert reservation.amount == 2 * _held(reservation.input_tokens, 50)
    assert "service_tier" not in fake.last.body  # the request is sent as the caller made it
    line = charge_line(reservation)
    assert (line.service_tier, line.cost) == ("priority", Decimal("80.5"))
    assert line.overage == 0
    with pytest.raises(InvalidUsage, match="project_tier"):
        guard(sdk, tenant="acme", project_tier="auto")


@pytest.mark.parametrize("stream", [False, True])
def test_a_previous_response_the_guard_recorded_holds_its_chain_not_the_window(
    fake: FakeOpenAI, stream: bool
) -> None:
    client = _client(fake.base_url)
    first = client.responses.create(model=GPT, input="Hi.", max_output_tokens=50, stream=stream)
    if stream:
        for _ in first:
            pass
    # The answer (resp_fake) reported 20 input and 12 output tokens: no context window needed.
    client.responses.create(
        model=GPT, input="go on", max_output_tokens=50, previous_response_id="resp_fake"
    )
    second = Reservation.objects.order_by("created_at").last()
    assert second is not None
    assert second.input_tokens == _counted([{"role": "user", "content": "go on"}]) + 20 + 12
    assert second.state == "committed"
    # Another tenant naming that id is not held at acme's record: at the window, or refused.
    budgets.ensure_tenant(tenant="other", name="Other")
    budgets.set_limit(tenant="other", amount=Decimal("100000"), window="month")
    sdk = openai.OpenAI(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(InvalidUsage, match="context_window"):
        guard(sdk, tenant="other").responses.create(
            model=GPT, input="go on", max_output_tokens=50, previous_response_id="resp_fake"
        )


def test_max_tool_calls_in_extra_body_is_held_as_the_parameter(fake: FakeOpenAI) -> None:
    _client(fake.base_url).responses.create(
        model=GPT,
        input="news?",
        tools=[{"type": "web_search"}],
        max_output_tokens=50,
        extra_body={"max_tool_calls": 7},
    )
    reservation = only_reservation()
    assert reservation.max_tool_calls == {"web_search": 7}
    assert fake.last.body["max_tool_calls"] == 7


def test_a_ledger_that_cannot_be_read_for_the_models_limits_fails_closed(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    from llm_budgets.exceptions import LedgerUnavailable
    from llm_budgets.integrations import openai as guarded_openai

    def down(call: object) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(guarded_openai, "_plan_default", down)
    with pytest.raises(LedgerUnavailable):
        _client(fake.base_url).chat.completions.create(model=GPT, messages=MESSAGES)
    assert fake.requests == []
