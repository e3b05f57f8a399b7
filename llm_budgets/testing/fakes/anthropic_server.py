"""Anthropic's Messages shapes, JSON and SSE: ``input_tokens`` without cache reads and writes,
``cache_creation`` split 5-minute / 1-hour, ``server_tool_use``; in a stream the input usage in
``message_start`` and the cumulative output in ``message_delta``. With ``thinking`` asked, a
stream starts with a thinking block whose deltas summarise the thinking (billed in full)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llm_budgets.testing.fakes.server import Behaviour, FakeProvider, Seen

DEFAULT_USAGE = {
    "input_tokens": 30,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 50,
    "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 20},
    "output_tokens": 15,
    "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
}


class FakeAnthropic(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.usage = json.loads(json.dumps(DEFAULT_USAGE))

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
        return self._message(seen, [{"type": "text", "text": behaviour.text}], self._usage(seen))

    def _delta(self, seen: Seen, text: str) -> dict[str, Any]:
        if seen.body.get("thinking"):
            return {"type": "thinking_delta", "thinking": text}
        return {"type": "text_delta", "text": text}

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
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
        yield (
            "message_delta",
            json.dumps(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {
                        "output_tokens": usage["output_tokens"],
                        "server_tool_use": usage.get("server_tool_use"),
                    },
                }
            ),
        )
        yield "message_stop", json.dumps({"type": "message_stop"})
