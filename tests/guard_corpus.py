"""The differential harness's corpus (tests/test_guard_differential.py): named calls through the
real SDK clients wrapped by ``guard()``, against fakes that bill by the providers' published rules
(llm_budgets/testing/fakes/bills.py).

Each case names one way an application calls a provider: which SDK, sync or async, streamed or
not, stopped early or not, its arguments, and the prices the ledger has (``"tiers"``: the rate
table with each model's premium-tier and fast-mode rates listed; ``"catalogue"``: base rates only,
as the catalogue import brings them). ``issue``: the finding of issue #39 it reproduces
(``"under-charge"``, ``"false refusal"``), or "" for an ordinary call. ``ordinary``: an
application sends it as a matter of course, so refusing it is a false refusal; a call that
smuggles a priced parameter through ``extra_body`` is not ordinary (a refusal that says why is a
right answer), but if it is admitted it must be charged what it is billed.
"""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import pydantic

GPT = "gpt-4o"
GPT5 = "gpt-5"
AUDIO = "gpt-4o-audio-preview"
SEARCH = "gpt-4o-search-preview"
EMBED = "text-embedding-3-small"
MODERATE = "omni-moderation-latest"
SONNET = "claude-sonnet-4-5"
OPUS = "claude-opus-4-6"
HAIKU = "claude-haiku-4-5"

UNDER_CHARGE = "under-charge"
FALSE_REFUSAL = "false refusal"


def png(width: int, height: int) -> str:
    """A base64 PNG of that size (its header is all a size reader needs)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    raw = (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
    )
    return base64.b64encode(raw).decode()


class Greeting(pydantic.BaseModel):
    greeting: str


def pdf(pages: int) -> str:
    """A base64 PDF of that many (empty) pages."""
    kids = " ".join(f"{3 + n} 0 R" for n in range(pages))
    objects = [
        "1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj",
        f"2 0 obj << /Type /Pages /Kids [{kids}] /Count {pages} >> endobj",
        *(f"{3 + n} 0 obj << /Type /Page /Parent 2 0 R >> endobj" for n in range(pages)),
    ]
    raw = "%PDF-1.4\n" + "\n".join(objects) + "\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    return base64.b64encode(raw.encode()).decode()


SAY = [{"role": "user", "content": "Say hello, briefly, in English."}]
LONG_TEXT = "The ledger admits before the call and settles after it. " * 40


@dataclass(frozen=True)
class Case:
    name: str
    sdk: str  # "openai" | "anthropic"
    call: str  # the method's path from the guarded client
    kwargs: dict[str, Any]
    issue: str = ""
    ordinary: bool = True
    asynchronous: bool = False
    stream: bool = False  # iterate the answer (stream=True, or a .stream() helper)
    helper: bool = False  # a .stream() context manager
    stop_after: int | None = None  # text deltas the caller reads before it stops
    prices: str = "tiers"
    fake: dict[str, Any] = field(default_factory=dict)  # knobs set on the fake
    chain: dict[str, Any] | None = None  # an earlier call whose id goes in previous_response_id
    chain_via_extra_body: bool = False
    warm: bool = False  # the same call once before (a prompt cache written, then read)
    text: str | None = None  # the fake's answer text (parse helpers need JSON)
    note: str = ""


def _chat(model: str = GPT, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": SAY, "max_completion_tokens": 200, **more}


def _responses(model: str = GPT, **more: Any) -> dict[str, Any]:
    return {"model": model, "input": "Say hello, briefly.", "max_output_tokens": 200, **more}


def _messages(model: str = HAIKU, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": SAY, "max_tokens": 300, **more}


_WEB = {"type": "web_search"}
_AWEB = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}

CASES: list[Case] = [
    # -- the 15 under-charges of issue #39 (and the streamed form of one) ----------------------
    Case(
        "oai_extra_body_priority",
        "openai",
        "chat.completions.create",
        _chat(extra_body={"service_tier": "priority"}),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "oai_extra_body_audio_out",
        "openai",
        "chat.completions.create",
        _chat(
            AUDIO,
            extra_body={
                "modalities": ["text", "audio"],
                "audio": {"voice": "alloy", "format": "wav"},
            },
        ),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "oai_extra_body_web_search_options",
        "openai",
        "chat.completions.create",
        _chat(SEARCH, extra_body={"web_search_options": {}}),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "oai_extra_body_more_tool_calls",
        "openai",
        "responses.create",
        _responses(tools=[_WEB], max_tool_calls=1, extra_body={"max_tool_calls": 3}),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "oai_extra_body_previous_response_id",
        "openai",
        "responses.create",
        _responses(),
        issue=UNDER_CHARGE,
        ordinary=False,
        chain=_responses(input=LONG_TEXT * 6),
        chain_via_extra_body=True,
    ),
    Case(
        "oai_extra_body_previous_response_id_stream_stopped",
        "openai",
        "responses.create",
        _responses(stream=True),
        issue=UNDER_CHARGE,
        ordinary=False,
        stream=True,
        stop_after=1,
        chain=_responses(input=LONG_TEXT * 6),
        chain_via_extra_body=True,
    ),
    Case(
        "oai_extra_body_conversation",
        "openai",
        "responses.create",
        _responses(extra_body={"conversation": "conv_fake"}),
        issue=UNDER_CHARGE,
        ordinary=False,
        fake={"conversations": {"conv_fake": 20_000}},
    ),
    Case(
        "oai_extra_body_stored_prompt",
        "openai",
        "responses.create",
        _responses(extra_body={"prompt": {"id": "pmpt_fake"}}),
        issue=UNDER_CHARGE,
        ordinary=False,
        fake={"prompts": {"pmpt_fake": 5_000}},
    ),
    Case(
        "ant_extra_body_fast",
        "anthropic",
        "messages.create",
        _messages(OPUS, extra_body={"speed": "fast"}),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "ant_extra_body_inference_geo",
        "anthropic",
        "messages.create",
        _messages(extra_body={"inference_geo": "us"}),
        issue=UNDER_CHARGE,
        ordinary=False,
    ),
    Case(
        "ant_extra_body_thinking_stream_stopped",
        "anthropic",
        "messages.create",
        _messages(
            SONNET,
            max_tokens=4000,
            stream=True,
            extra_body={"thinking": {"type": "enabled", "budget_tokens": 3000}},
        ),
        issue=UNDER_CHARGE,
        ordinary=False,
        stream=True,
        stop_after=1,
    ),
    Case(
        "ant_web_search_stream_stopped_after_search",
        "anthropic",
        "messages.create",
        _messages(SONNET, tools=[_AWEB], stream=True),
        issue=UNDER_CHARGE,
        stream=True,
        stop_after=1,
        note="the fees and result tokens arrive in message_delta, after the text started",
    ),
    Case(
        "oai_project_default_tier_priority",
        "openai",
        "chat.completions.create",
        _chat(),
        issue=UNDER_CHARGE,
        fake={"project_tier": "priority"},
        note="no service_tier asked; the answer says priority",
    ),
    Case(
        "oai_search_results_over_bound",
        "openai",
        "responses.create",
        _responses(tools=[_WEB], max_tool_calls=2),
        issue=UNDER_CHARGE,
        fake={"search_result_tokens": 24_000},
    ),
    Case(
        "oai_code_interpreter_output_as_input",
        "openai",
        "responses.create",
        _responses(
            tools=[{"type": "code_interpreter", "container": {"type": "auto"}}], max_tool_calls=1
        ),
        issue=UNDER_CHARGE,
        fake={"code_output_tokens": 6_000},
    ),
    Case(
        "oai_models_client_leak",
        "openai",
        "models._client.chat.completions.create",
        _chat(),
        issue=UNDER_CHARGE,
        ordinary=False,
        note="client.models._client is the unguarded client",
    ),
    # -- the 14 false refusals of issue #39 ----------------------------------------------------
    Case(
        "oai_previous_response_id",
        "openai",
        "responses.create",
        _responses(),
        issue=FALSE_REFUSAL,
        chain=_responses(input=LONG_TEXT),
    ),
    Case(
        "oai_conversation",
        "openai",
        "responses.create",
        _responses(conversation="conv_fake"),
        issue=FALSE_REFUSAL,
        fake={"conversations": {"conv_fake": 3_000}},
    ),
    Case(
        "oai_image_url_low_detail",
        "openai",
        "chat.completions.create",
        _chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this image?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://example.com/cat.png", "detail": "low"},
                        },
                    ],
                }
            ]
        ),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "ant_plain_text_document",
        "anthropic",
        "messages.create",
        _messages(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "text",
                                "media_type": "text/plain",
                                "data": LONG_TEXT,
                            },
                        },
                        {"type": "text", "text": "Summarise the document."},
                    ],
                }
            ]
        ),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_chat_stream_helper",
        "openai",
        "chat.completions.stream",
        {k: v for k, v in _chat().items()},
        issue=FALSE_REFUSAL,
        stream=True,
        helper=True,
    ),
    Case(
        "oai_responses_stream_helper",
        "openai",
        "responses.stream",
        _responses(),
        issue=FALSE_REFUSAL,
        stream=True,
        helper=True,
    ),
    Case(
        "ant_messages_parse",
        "anthropic",
        "messages.parse",
        _messages(output_format=Greeting),
        issue=FALSE_REFUSAL,
        text='{"greeting": "hello"}',
    ),
    Case(
        "ant_beta_messages",
        "anthropic",
        "beta.messages.create",
        _messages(),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_embeddings",
        "openai",
        "embeddings.create",
        {"model": EMBED, "input": ["The ledger admits before the call.", "And settles after."]},
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_n_choices",
        "openai",
        "chat.completions.create",
        _chat(n=3),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_priority_catalogue_price",
        "openai",
        "chat.completions.create",
        _chat(service_tier="priority"),
        issue=FALSE_REFUSAL,
        prices="catalogue",
    ),
    Case(
        "ant_inference_geo",
        "anthropic",
        "messages.create",
        _messages(inference_geo="us"),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_prediction",
        "openai",
        "chat.completions.create",
        _chat(prediction={"type": "content", "content": "Hello there, how are you today?"}),
        issue=FALSE_REFUSAL,
    ),
    Case(
        "oai_no_max_tokens",
        "openai",
        "chat.completions.create",
        {"model": GPT, "messages": SAY},
        issue=FALSE_REFUSAL,
        note="no ceiling and no plan default",
    ),
    # -- ordinary calls ------------------------------------------------------------------------
    Case("oai_chat", "openai", "chat.completions.create", _chat()),
    Case("oai_chat_async", "openai", "chat.completions.create", _chat(), asynchronous=True),
    Case(
        "oai_chat_stream",
        "openai",
        "chat.completions.create",
        _chat(stream=True),
        stream=True,
    ),
    Case(
        "oai_chat_stream_async_stopped",
        "openai",
        "chat.completions.create",
        _chat(stream=True),
        stream=True,
        asynchronous=True,
        stop_after=1,
    ),
    Case(
        "oai_chat_tools",
        "openai",
        "chat.completions.create",
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "description": "Look a word up.",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    },
                }
            ]
        ),
    ),
    Case(
        "oai_chat_priority",
        "openai",
        "chat.completions.create",
        _chat(service_tier="priority"),
    ),
    Case("oai_gpt5_flex", "openai", "chat.completions.create", _chat(GPT5, service_tier="flex")),
    Case("oai_gpt5_reasoning", "openai", "chat.completions.create", _chat(GPT5)),
    Case(
        "oai_gpt5_reasoning_stream_stopped",
        "openai",
        "chat.completions.create",
        _chat(GPT5, stream=True),
        stream=True,
        stop_after=1,
    ),
    Case(
        "oai_image_high_detail_inline",
        "openai",
        "chat.completions.create",
        _chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe it."},
                        {
                            "type": "image_url",
                            "image_url": {
                                "url": f"data:image/png;base64,{png(1600, 1200)}",
                                "detail": "high",
                            },
                        },
                    ],
                }
            ]
        ),
    ),
    Case("oai_responses", "openai", "responses.create", _responses()),
    Case(
        "oai_responses_async_stream",
        "openai",
        "responses.create",
        _responses(stream=True),
        stream=True,
        asynchronous=True,
    ),
    Case(
        "oai_responses_stream_stopped",
        "openai",
        "responses.create",
        _responses(stream=True),
        stream=True,
        stop_after=1,
    ),
    Case(
        "oai_responses_web_search",
        "openai",
        "responses.create",
        _responses(tools=[_WEB], max_tool_calls=2),
    ),
    Case("oai_moderation", "openai", "moderations.create", {"model": MODERATE, "input": "hello"}),
    Case("ant_messages", "anthropic", "messages.create", _messages()),
    Case("ant_messages_async", "anthropic", "messages.create", _messages(), asynchronous=True),
    Case(
        "ant_messages_stream",
        "anthropic",
        "messages.create",
        _messages(stream=True),
        stream=True,
    ),
    Case(
        "ant_messages_stream_stopped",
        "anthropic",
        "messages.create",
        _messages(stream=True),
        stream=True,
        stop_after=1,
    ),
    Case(
        "ant_stream_helper",
        "anthropic",
        "messages.stream",
        _messages(),
        stream=True,
        helper=True,
    ),
    Case(
        "ant_stream_helper_async_stopped",
        "anthropic",
        "messages.stream",
        _messages(),
        stream=True,
        helper=True,
        asynchronous=True,
        stop_after=1,
    ),
    Case("ant_web_search", "anthropic", "messages.create", _messages(SONNET, tools=[_AWEB])),
    Case(
        "ant_web_search_stream",
        "anthropic",
        "messages.create",
        _messages(SONNET, tools=[_AWEB], stream=True),
        stream=True,
    ),
    Case(
        "ant_thinking",
        "anthropic",
        "messages.create",
        _messages(SONNET, max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 2000}),
    ),
    Case(
        "ant_thinking_stream_stopped",
        "anthropic",
        "messages.create",
        _messages(
            SONNET,
            max_tokens=4000,
            thinking={"type": "enabled", "budget_tokens": 2000},
            stream=True,
        ),
        stream=True,
        stop_after=1,
    ),
    Case("ant_fast", "anthropic", "messages.create", _messages(OPUS, speed="fast")),
    Case(
        "ant_image_inline",
        "anthropic",
        "messages.create",
        _messages(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": png(1000, 800),
                            },
                        },
                        {"type": "text", "text": "Describe it."},
                    ],
                }
            ]
        ),
    ),
    Case(
        "ant_tools",
        "anthropic",
        "messages.create",
        _messages(
            tools=[
                {
                    "name": "lookup",
                    "description": "Look a word up.",
                    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                }
            ]
        ),
    ),
]

_CACHED_SYSTEM = LONG_TEXT * 3


def _cached_system(ttl: str | None = None) -> list[dict[str, Any]]:
    control: dict[str, Any] = {"type": "ephemeral"}
    if ttl:
        control["ttl"] = ttl
    return [{"type": "text", "text": _CACHED_SYSTEM, "cache_control": control}]


CASES += [
    Case(
        "oai_chat_parse",
        "openai",
        "chat.completions.parse",
        _chat(response_format=Greeting),
        text='{"greeting": "hello"}',
    ),
    Case(
        "ant_web_search_stream_async_stopped_after_search",
        "anthropic",
        "messages.create",
        _messages(SONNET, tools=[_AWEB], stream=True),
        stream=True,
        asynchronous=True,
        stop_after=1,
    ),
    Case(
        "ant_thinking_stream_async_stopped",
        "anthropic",
        "messages.create",
        _messages(
            SONNET,
            max_tokens=4000,
            thinking={"type": "enabled", "budget_tokens": 2000},
            stream=True,
        ),
        stream=True,
        asynchronous=True,
        stop_after=1,
    ),
    Case(
        "ant_pdf_document",
        "anthropic",
        "messages.create",
        _messages(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "base64",
                                "media_type": "application/pdf",
                                "data": pdf(3),
                            },
                        },
                        {"type": "text", "text": "Summarise the document."},
                    ],
                }
            ]
        ),
    ),
    Case(
        "oai_responses_file_search",
        "openai",
        "responses.create",
        _responses(
            tools=[{"type": "file_search", "vector_store_ids": ["vs_fake"]}], max_tool_calls=2
        ),
    ),
    Case(
        "ant_web_fetch",
        "anthropic",
        "messages.create",
        _messages(
            SONNET,
            tools=[
                {
                    "type": "web_fetch_20250910",
                    "name": "web_fetch",
                    "max_uses": 2,
                    "max_content_tokens": 5_000,
                }
            ],
        ),
    ),
    Case(
        "oai_audio_input",
        "openai",
        "chat.completions.create",
        _chat(
            AUDIO,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What does the speaker say?"},
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(bytes(32_000)).decode(),
                                "format": "wav",
                            },
                        },
                    ],
                }
            ],
        ),
        ordinary=False,
        note="refused until the price table has audio rates; admitted, it must be charged them",
    ),
    Case(
        "ant_cache_write_1h",
        "anthropic",
        "messages.create",
        _messages(SONNET, system=_cached_system("1h")),
    ),
    Case(
        "ant_cache_read_stream",
        "anthropic",
        "messages.create",
        _messages(SONNET, system=_cached_system(), stream=True),
        stream=True,
        warm=True,
    ),
]

BY_NAME = {case.name: case for case in CASES}
assert len(BY_NAME) == len(CASES), "case names are unique"
