"""Anthropic's Messages shapes, JSON and SSE: ``input_tokens`` without cache reads and writes,
``cache_creation`` split 5-minute / 1-hour, ``server_tool_use``; in a stream the input usage in
``message_start`` and the cumulative output in ``message_delta``. With ``thinking`` asked, a
stream starts with a thinking block whose deltas summarise the thinking (billed in full).

``FakeAnthropic(realistic=True)`` answers with the usage the request makes Anthropic bill, by
:mod:`llm_budgets.testing.fakes.bills` (text, images, plain-text documents, the tool-use system
prompt, server tools and their results, thinking up to its budget, ``speed`` and
``inference_geo`` as ``usage.speed`` / ``usage.inference_geo``), streams server tool blocks before
the text (their fees and result tokens only in ``message_delta``'s usage), and records each
request's bill (``fake.bills``, ``seen.bill``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llm_budgets.testing.fakes import bills
from llm_budgets.testing.fakes.server import Behaviour, FakeProvider, Seen

DEFAULT_USAGE = {
    "input_tokens": 30,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 50,
    "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 20},
    "output_tokens": 15,
    "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
}


# What a realistic fake assumes where the request does not say (knobs on the fake).
SEARCH_RESULT_TOKENS = 8_000  # per web search, billed as input
FETCH_TOKENS = 10_000  # per web fetch without max_content_tokens
THINKING_SUMMARY = "Considering. "  # what a thinking block streams: a summary, not the thinking


def _message_delta(usage: dict[str, Any]) -> tuple[str, str]:
    """The stream's last usage: cumulative, server tool use included."""
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": usage,
    }
    return "message_delta", json.dumps(delta)


class _Plan:
    """What a realistic answer will be: usage, modifiers, server tool uses and text."""

    def __init__(self, fake: FakeAnthropic, seen: Seen, behaviour: Behaviour) -> None:
        body = seen.body
        self.model = str(body.get("model", ""))
        self.text = behaviour.text * behaviour.chunks
        ceiling = int(body.get("max_tokens") or 0)
        counted = bills.anthropic_input(body, fake.image_sizes)
        self.prompt_tokens = counted.total
        # Prompt caching: the prefix up to the last breakpoint is read if an earlier call
        # wrote it, else written (at the 5-minute or 1-hour write rate).
        read = written = written_1h = 0
        prefix = bills.anthropic_cache_prefix(body, fake.image_sizes)
        if prefix is not None:
            key, tokens, ttl = prefix
            if key in fake.cache:
                read = tokens
            elif ttl == "1h":
                written_1h = tokens
            else:
                written = tokens
            fake.cache.add(key)
        results = 0
        self.uses: dict[str, int] = {}
        for tool in body.get("tools") or []:
            kind = str(tool.get("type", ""))
            if kind.startswith("web_search"):
                uses = int(tool.get("max_uses") or 1)  # the worst case: every use allowed
                self.uses["web_search"] = self.uses.get("web_search", 0) + uses
                results += uses * fake.search_result_tokens
            elif kind.startswith("web_fetch"):
                uses = int(tool.get("max_uses") or 1)
                self.uses["web_fetch"] = self.uses.get("web_fetch", 0) + uses
                results += uses * int(tool.get("max_content_tokens") or FETCH_TOKENS)
        self.visible = min(bills.claude_tokens(self.text), ceiling)
        thinking = body.get("thinking") or {}
        self.thinking = 0
        if thinking.get("type") == "enabled":  # thinking billed to its budget, within max_tokens
            self.thinking = min(int(thinking.get("budget_tokens") or 0), ceiling - self.visible)
        self.usage = bills.Usage(
            input_tokens=self.prompt_tokens + results,
            cached_input_tokens=read,
            cache_write_tokens=written,
            cache_write_1h_tokens=written_1h,
            output_tokens=self.thinking + self.visible,
            reasoning_tokens=self.thinking,
            tool_calls=self.uses,
        )
        self.speed = "fast" if body.get("speed") == "fast" else "standard"
        self.geo = "us" if body.get("inference_geo") == "us" else "global"
        modifiers = []
        if self.speed == "fast":
            modifiers.append("fast")
        if self.geo == "us":
            modifiers.append("geo_us")
        self.modifiers = tuple(modifiers)

    def bill(self, *, sent: str | None = None) -> bills.Bill:
        usage = self.usage
        if sent is not None:  # a cut stream: thinking and tools ran first, text as far as sent
            usage = bills.Usage(
                **{**usage.__dict__, "output_tokens": self.thinking + bills.claude_tokens(sent)}
            )
        return bills.bill("anthropic", self.model, usage, modifiers=self.modifiers)

    def usage_json(self, *, output_tokens: int | None = None) -> dict[str, Any]:
        u = self.usage
        cached = u.cached_input_tokens + u.cache_write_tokens + u.cache_write_1h_tokens
        return {  # Anthropic's input_tokens leave out cache reads and writes
            "input_tokens": u.input_tokens - cached,
            "cache_read_input_tokens": u.cached_input_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens + u.cache_write_1h_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": u.cache_write_tokens,
                "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
            },
            "output_tokens": u.output_tokens if output_tokens is None else output_tokens,
            "server_tool_use": {
                "web_search_requests": self.uses.get("web_search", 0),
                "web_fetch_requests": self.uses.get("web_fetch", 0),
            },
            "service_tier": "standard",
            "speed": self.speed,
            "inference_geo": self.geo,
        }

    def tool_blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        for name, uses in self.uses.items():
            for n in range(uses):
                blocks.append(
                    {
                        "type": "server_tool_use",
                        "id": f"srvtoolu_{name}_{n}",
                        "name": name,
                        "input": {"query": "fake"}
                        if name == "web_search"
                        else {"url": "https://example.com"},
                    }
                )
                blocks.append(
                    {
                        "type": f"{name}_tool_result",
                        "tool_use_id": f"srvtoolu_{name}_{n}",
                        "content": [],
                    }
                )
        return blocks


class FakeAnthropic(FakeProvider):
    def __init__(self, *, realistic: bool = False) -> None:
        super().__init__()
        self.usage = json.loads(json.dumps(DEFAULT_USAGE))
        self.realistic = realistic
        self.bills: list[bills.Bill] = []
        self.search_result_tokens = SEARCH_RESULT_TOKENS
        self.image_sizes: dict[str, tuple[int, int]] = {}
        self.cache: set[str] = set()  # prompt prefixes written to the cache

    def _usage(self, seen: Seen) -> dict[str, Any]:
        """``self.usage`` as the provider would report it for this request: a server tool's
        uses only where the request declared that tool."""
        usage = json.loads(json.dumps(self.usage))
        declared = {str(tool.get("type", "")) for tool in seen.body.get("tools") or []}
        for name, key in (
            ("web_search", "web_search_requests"),
            ("web_fetch", "web_fetch_requests"),
        ):
            used = usage.get("server_tool_use") or {}
            if key in used and not any(kind.startswith(name) for kind in declared):
                used[key] = 0
        return usage

    def error_json(self, status: int) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "fake_error", "message": f"fake {status}"}}

    def _message(self, seen: Seen, content: list[Any], usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": seen.body.get("model"),
            "content": content,
            "stop_reason": "end_turn" if content else None,
            "stop_sequence": None,
            "usage": usage,
        }

    def answer_json(self, seen: Seen, behaviour: Behaviour) -> dict[str, Any]:
        if self.realistic:
            p = seen.plan = _Plan(self, seen, behaviour)
            content: list[dict[str, Any]] = []
            if p.thinking:
                content.append({"type": "thinking", "thinking": THINKING_SUMMARY, "signature": "s"})
            content += [*p.tool_blocks(), {"type": "text", "text": p.text}]
            return self._message(seen, content, p.usage_json())
        return self._message(seen, [{"type": "text", "text": behaviour.text}], self._usage(seen))

    def _delta(self, seen: Seen, text: str) -> dict[str, Any]:
        if seen.body.get("thinking"):
            return {"type": "thinking_delta", "thinking": text}
        return {"type": "text_delta", "text": text}

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        if self.realistic:
            yield from self._realistic_events(seen, behaviour)
            return
        usage = self._usage(seen)
        start_usage = {**usage, "output_tokens": 1}
        start_usage.pop("server_tool_use", None)
        yield (
            "message_start",
            json.dumps({"type": "message_start", "message": self._message(seen, [], start_usage)}),
        )
        yield (
            "content_block_start",
            json.dumps(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": (
                        {"type": "thinking", "thinking": "", "signature": ""}
                        if seen.body.get("thinking")
                        else {"type": "text", "text": ""}
                    ),
                }
            ),
        )
        for _ in range(behaviour.chunks):
            yield (
                "content_block_delta",
                json.dumps(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": self._delta(seen, behaviour.text),
                    }
                ),
            )
        yield "content_block_stop", json.dumps({"type": "content_block_stop", "index": 0})
        if not behaviour.usage:
            return
        yield _message_delta(
            {
                "output_tokens": usage["output_tokens"],
                "server_tool_use": usage.get("server_tool_use"),
            }
        )
        yield "message_stop", json.dumps({"type": "message_stop"})

    # -- the realistic fake ------------------------------------------------------------------

    def _realistic_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        p = seen.plan = _Plan(self, seen, behaviour)
        start = p.usage_json(output_tokens=1)  # the prompt's input: search results come later
        start["input_tokens"] -= p.usage.input_tokens - p.prompt_tokens
        start.pop("server_tool_use")
        yield (
            "message_start",
            json.dumps({"type": "message_start", "message": self._message(seen, [], start)}),
        )
        blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        if p.thinking:
            blocks.append(
                (
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [{"type": "thinking_delta", "thinking": THINKING_SUMMARY}],
                )
            )
        blocks += [(block, []) for block in p.tool_blocks()]
        blocks.append(
            (
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": behaviour.text}] * behaviour.chunks,
            )
        )
        for index, (block, deltas) in enumerate(blocks):
            yield (
                "content_block_start",
                json.dumps({"type": "content_block_start", "index": index, "content_block": block}),
            )
            for delta in deltas:
                yield (
                    "content_block_delta",
                    json.dumps({"type": "content_block_delta", "index": index, "delta": delta}),
                )
            yield "content_block_stop", json.dumps({"type": "content_block_stop", "index": index})
        if not behaviour.usage:
            return
        final = p.usage_json()
        yield _message_delta(
            {name: final[name] for name in ("input_tokens", "output_tokens", "server_tool_use")}
        )
        yield "message_stop", json.dumps({"type": "message_stop"})

    def event_text(self, event: str, data: str) -> str:
        if not self.realistic or event != "content_block_delta":
            return ""
        return str(json.loads(data)["delta"].get("text", ""))

    def billed(self, seen: Seen, *, cut: bool) -> None:
        if not self.realistic or seen.plan is None:
            return
        seen.bill = seen.plan.bill(sent=seen.text_sent if cut else None)
        self.bills.append(seen.bill)
