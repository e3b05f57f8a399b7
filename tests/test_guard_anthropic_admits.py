"""Issue #39 items 1 (``extra_body``) and 3 for Anthropic, with the real ``anthropic`` client
against the fake Anthropic: what can be bounded is admitted at its worst case (fast mode and US
inference at their rates, documents, PDFs by page, images by URL, ``parse()``, the ``beta``
messages), ``extra_body`` is checked and priced as the same parameters, and what cannot be
bounded is refused with a way to make it admissible, before anything is sent."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import anthropic
import pydantic
import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.exceptions import InvalidUsage, UnknownPrice
from llm_budgets.integrations.anthropic import WEB_SEARCH_CONTENT_TOKENS_PER_USE, guard
from llm_budgets.integrations.anthropic_media import IMAGE_MAX_TOKENS, PDF_PAGE_TOKENS
from llm_budgets.integrations.guarding import NotGuarded
from llm_budgets.models import Reservation
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.server import WAIT
from tests.factories import PRICES_START
from tests.integrations import (
    CLAUDE,
    assert_conserved,
    charge_line,
    only_reservation,
    seed_tenant,
)

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
USAGE = {"input_tokens": 30, "output_tokens": 15}
# Standard rates per token (tests/integrations.py): input 1, output 2.
STANDARD = Decimal(30 * 1 + 15 * 2)


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    seed_tenant()
    server = FakeAnthropic()
    server.usage = dict(USAGE)
    yield server
    server.stop()


def _client(fake: FakeAnthropic) -> object:
    sdk = anthropic.Anthropic(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    return guard(sdk, tenant="acme", end_user="u-1")


def _price_modifiers() -> None:
    """A price listing fast mode (6x) and US inference (1.1x, alone and with fast), as a
    catalogue would (the multiplier table covers prices that list none)."""
    budgets.set_price(
        provider="anthropic",
        model=CLAUDE,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(2000000),
        service_tiers={
            "fast": {"input_per_mtok": "6000000", "output_per_mtok": "12000000"},
            "geo_us": {"input_per_mtok": "1100000", "output_per_mtok": "2200000"},
            "fast+geo_us": {"input_per_mtok": "6600000", "output_per_mtok": "13200000"},
        },
        effective_from=PRICES_START + timedelta(seconds=1),
    )


def _create(fake: FakeAnthropic, **kwargs: object) -> object:
    return _client(fake).messages.create(  # type: ignore[attr-defined]
        **{"model": CLAUDE, "max_tokens": 100, "messages": MESSAGES, **kwargs}
    )


# -- extra_body: checked and priced as the same parameter --------------------------------------


@pytest.mark.parametrize(
    ("extra_body", "tier", "cost"),
    [
        ({"speed": "fast"}, "fast", 30 * 6 + 15 * 12),
        ({"inference_geo": "us"}, "geo_us", Decimal("30") * Decimal("1.1") + 15 * Decimal("2.2")),
        (
            {"speed": "fast", "inference_geo": "us"},
            "fast+geo_us",
            Decimal("30") * Decimal("6.6") + 15 * Decimal("13.2"),
        ),
    ],
)
def test_a_billing_modifier_in_extra_body_is_held_and_charged_at_its_rates(
    fake: FakeAnthropic, extra_body: dict[str, str], tier: str, cost: Decimal
) -> None:
    _price_modifiers()
    _create(fake, extra_body=extra_body)
    assert {key: fake.last.body[key] for key in extra_body} == extra_body
    reservation = only_reservation()
    assert reservation.service_tier == tier
    assert charge_line(reservation).cost == cost
    assert_conserved()


@override_settings(LLM_BUDGETS={"SERVICE_TIER_MULTIPLIERS": {"anthropic": {}}})
def test_a_modifier_without_a_price_is_refused_never_held_at_standard(fake: FakeAnthropic) -> None:
    # Neither listed by the price nor given a multiplier by the operator.
    with pytest.raises(UnknownPrice, match="geo_us"):
        _create(fake, extra_body={"inference_geo": "us"})
    assert fake.requests == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"extra_body": {"frobnicate": True}}, NotGuarded, "frobnicate"),
        ({"extra_body": {"container": "cntr_1"}}, NotGuarded, "container"),
        ({"extra_body": {"speed": "ludicrous"}}, NotGuarded, "speed"),
        ({"speed": "standard", "extra_body": {"speed": "fast"}}, InvalidUsage, "both"),
        ({"extra_body": ["speed", "fast"]}, InvalidUsage, "extra_body"),
        ({"extra_body": {"stream": True}}, InvalidUsage, "stream=True"),
        (
            {"extra_body": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}},
            InvalidUsage,
            "max_uses",
        ),
    ],
)
def test_extra_body_is_denied_by_default_before_sending(
    fake: FakeAnthropic, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _create(fake, **kwargs)
    assert fake.requests == []
    assert Reservation.objects.count() == 0


def test_server_tools_in_extra_body_are_held_at_their_uses(fake: FakeAnthropic) -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    _create(fake)
    _create(fake, extra_body={"tools": [search]})
    plain, searching = Reservation.objects.order_by("created_at")
    assert searching.max_tool_calls == {"web_search": 1}
    # The tool definition, the tool-use system prompt and one search's results bound.
    assert searching.input_tokens > plain.input_tokens + WEB_SEARCH_CONTENT_TOKENS_PER_USE


def test_a_thinking_stream_from_extra_body_stopped_early_is_charged_the_ceiling(
    fake: FakeAnthropic,
) -> None:
    fake.then(chunks=200, delay=0.02)
    with _client(fake).messages.stream(  # type: ignore[attr-defined]
        model=CLAUDE,
        max_tokens=4000,
        messages=MESSAGES,
        extra_body={"thinking": {"type": "enabled", "budget_tokens": 2000}},
    ) as stream:
        for _event in stream:
            break
    assert fake.last.client_closed.wait(WAIT)
    # The summary streamed is not what was billed: thinking up to the ceiling may have been.
    assert charge_line(only_reservation()).output_tokens == 4000
    assert_conserved()


def test_a_thinking_budget_in_extra_body_is_pinned_below_the_clamped_ceiling_there(
    fake: FakeAnthropic,
) -> None:
    budgets.set_price(
        provider="anthropic",
        model=CLAUDE,
        input_per_mtok=Decimal(1000000),
        output_per_mtok=Decimal(2000000),
        max_output_tokens=3000,
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    _create(
        fake,
        max_tokens=8000,
        extra_body={"thinking": {"type": "enabled", "budget_tokens": 6000}},
    )
    assert fake.last.body["max_tokens"] == 3000
    assert fake.last.body["thinking"]["budget_tokens"] == 2999


# -- what the answer says it was billed at ------------------------------------------------------


FAST = Decimal(30 * 6 + 15 * 12)
GEO_US = Decimal("30") * Decimal("1.1") + 15 * Decimal("2.2")


def _billed_at(cost: Decimal, *, held: bool) -> None:
    """The call is charged what the answer says it was billed at; an answer at a mode the hold
    did not price may instead be left uncertain (counted at its hold), never charged at the
    standard rates."""
    reservation = only_reservation()
    if held or reservation.state != "uncertain":
        assert reservation.state == "committed"
        assert charge_line(reservation).cost == cost
    assert_conserved()


@pytest.mark.parametrize(
    ("asked", "answered", "cost"),
    [
        ({}, {"speed": "fast"}, FAST),
        ({}, {"inference_geo": "us"}, GEO_US),
        ({"inference_geo": "us"}, {"inference_geo": "us"}, GEO_US),
        ({"speed": "fast"}, {"speed": "fast", "inference_geo": "global"}, FAST),
        ({}, {"speed": "standard", "inference_geo": "global"}, STANDARD),
    ],
)
def test_an_answer_billed_at_a_mode_the_hold_did_not_price_is_never_charged_at_standard(
    fake: FakeAnthropic, asked: dict[str, str], answered: dict[str, str], cost: Decimal
) -> None:
    _price_modifiers()
    fake.usage = {**USAGE, **answered}
    _create(fake, **asked)
    _billed_at(cost, held=bool(asked) or cost == STANDARD)


def test_a_stream_whose_start_reports_fast_mode_unasked_is_not_charged_at_standard(
    fake: FakeAnthropic,
) -> None:
    _price_modifiers()
    fake.usage = {**USAGE, "speed": "fast"}
    list(_create(fake, stream=True))  # type: ignore[call-overload]
    _billed_at(FAST, held=False)


# -- documents and images -----------------------------------------------------------------------


def _pdf(pages: int, *, object_stream: bool = False) -> str:
    """A small PDF of ``pages`` pages, base64; with ``object_stream`` its page objects are
    inside a compressed object stream (PDF 1.5), as many producers write them."""
    kids = " ".join(f"{3 + n} 0 R" for n in range(pages))
    page_objects = [b"<< /Type /Page /Parent 2 0 R >>" for _ in range(pages)]
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Kids [{kids}] >>".encode()]
    if object_stream:
        packed = zlib.compress(b" ".join(page_objects))
        objects.append(
            b"<< /Type /ObjStm /N %d /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream"
            % (pages, len(packed), packed)
        )
    else:
        objects += page_objects
    body = b"%PDF-1.7\n" + b"".join(
        b"%d 0 obj\n%s\nendobj\n" % (n + 1, obj) for n, obj in enumerate(objects)
    )
    return base64.b64encode(body + b"trailer << /Root 1 0 R >>\n%%EOF\n").decode()


def _with(block: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [block, {"type": "text", "text": "Say hello."}]}]


def _held_beyond_text(fake: FakeAnthropic, block: dict[str, object]) -> int:
    """The input tokens held for ``block`` beyond the same request without it."""
    _create(fake)
    _create(fake, messages=_with(block))
    plain, carrying = Reservation.objects.order_by("created_at")
    assert carrying.state == "committed"
    assert fake.last.body["messages"][0]["content"][0] == block  # sent as given
    return carrying.input_tokens - plain.input_tokens


@pytest.mark.parametrize("object_stream", [False, True])
def test_an_inline_pdf_is_held_by_its_pages(fake: FakeAnthropic, object_stream: bool) -> None:
    source = {
        "type": "base64",
        "media_type": "application/pdf",
        "data": _pdf(3, object_stream=object_stream),
    }
    held = _held_beyond_text(fake, {"type": "document", "source": source})
    assert held == 3 * PDF_PAGE_TOKENS


def test_a_plain_text_document_is_held_as_its_text(fake: FakeAnthropic) -> None:
    text = "The quarterly report says revenue grew. " * 50
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": text},
        "title": "Q3",
    }
    _create(fake, messages=_with({"type": "text", "text": "Q3\n" + text}))
    _create(fake, messages=_with(document))
    as_text, as_document = Reservation.objects.order_by("created_at")
    assert as_document.input_tokens == as_text.input_tokens
    assert as_document.state == "committed"


def test_an_image_by_url_is_held_at_the_most_an_image_costs(fake: FakeAnthropic) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/chart.png"}}
    assert _held_beyond_text(fake, image) == IMAGE_MAX_TOKENS


@pytest.mark.parametrize(
    "source",
    [
        {"type": "url", "url": "https://example.com/report.pdf"},
        {"type": "file", "file_id": "file_1"},
        {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(b"no").decode(),
        },
    ],
)
def test_a_pdf_whose_pages_cannot_be_counted_is_refused_with_how_to_send_it(
    fake: FakeAnthropic, source: dict[str, object]
) -> None:
    with pytest.raises(InvalidUsage, match="text document") as refused:
        _create(fake, messages=_with({"type": "document", "source": source}))
    assert refused.value.field == "messages"
    assert fake.requests == []


# -- parse() and the beta namespace -------------------------------------------------------------


class Greeting(pydantic.BaseModel):
    greeting: str


def test_parse_is_admitted_with_its_schema_counted(fake: FakeAnthropic) -> None:
    fake.then(text='{"greeting": "hi"}')
    parsed = _client(fake).messages.parse(  # type: ignore[attr-defined]
        model=CLAUDE, max_tokens=100, messages=MESSAGES, output_format=Greeting
    )
    assert parsed.parsed_output == Greeting(greeting="hi")
    assert fake.last.body["output_config"]["format"]["type"] == "json_schema"
    reservation = only_reservation()
    assert reservation.max_output_tokens == 100
    assert charge_line(reservation).cost == STANDARD
    assert_conserved()


def test_beta_messages_create_stream_and_parse_are_guarded(fake: FakeAnthropic) -> None:
    beta = _client(fake).beta.messages  # type: ignore[attr-defined]
    betas = ["interleaved-thinking-2025-05-14"]
    beta.create(model=CLAUDE, max_tokens=100, messages=MESSAGES, betas=betas)
    with beta.stream(model=CLAUDE, max_tokens=100, messages=MESSAGES) as stream:
        assert "".join(stream.text_stream) == "Hello from the fake. " * 3
    fake.then(text='{"greeting": "hi"}')
    parsed = beta.parse(model=CLAUDE, max_tokens=100, messages=MESSAGES, output_format=Greeting)
    assert parsed.parsed_output == Greeting(greeting="hi")
    assert len(fake.requests) == 3
    assert [r.state for r in Reservation.objects.all()] == ["committed"] * 3
    assert_conserved()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"betas": ["some-new-beta-2027-01-01"]}, "some-new-beta"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "MCP"),
        ({"fallbacks": [{"model": "claude-opus-4-6"}]}, "fallback"),
        ({"context_management": {"edits": [{"type": "compact_20260112"}]}}, "compact"),
        ({"extra_body": {"betas": ["some-new-beta-2027-01-01"]}}, "some-new-beta"),
    ],
)
def test_beta_parameters_that_change_the_price_are_refused_before_sending(
    fake: FakeAnthropic, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(NotGuarded, match=match):
        _client(fake).beta.messages.create(  # type: ignore[attr-defined]
            model=CLAUDE, max_tokens=100, messages=MESSAGES, **kwargs
        )
    assert fake.requests == []


def test_the_async_beta_messages_and_parse(fake: FakeAnthropic) -> None:
    sdk = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    client = guard(sdk, tenant="acme", end_user="u-1")
    fake.then().then(text='{"greeting": "hi"}')

    async def call() -> object:
        await client.beta.messages.create(
            model=CLAUDE,
            max_tokens=100,
            messages=MESSAGES,
            betas=["context-management-2025-06-27"],
            context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
        )
        parsed = await client.messages.parse(
            model=CLAUDE, max_tokens=100, messages=MESSAGES, output_format=Greeting
        )
        async with client.beta.messages.stream(
            model=CLAUDE, max_tokens=100, messages=MESSAGES
        ) as stream:
            assert "".join([text async for text in stream.text_stream])
        return parsed.parsed_output

    assert async_to_sync(call)() == Greeting(greeting="hi")
    assert [r.state for r in Reservation.objects.all()] == ["committed"] * 3
    assert charge_line(Reservation.objects.order_by("created_at").last()).cost == STANDARD
    assert_conserved()
