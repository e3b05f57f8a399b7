"""OpenAI's shapes: Chat Completions and Responses, JSON and SSE, with usage as OpenAI sends it
(``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``; in a
stream, a last chunk with ``choices: []`` and the usage, only when ``include_usage`` is asked),
the ``service_tier`` the answer was served at when one is set, and an output item per built-in
tool of a Responses request (the calls it made), as OpenAI reports them. A reasoning model
streams no reasoning: its deltas are the visible answer only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llm_budgets.testing.fakes.server import Behaviour, FakeProvider, Seen

DEFAULT_USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 12,
    "cached_tokens": 5,
    "reasoning_tokens": 4,
}


# The output item each built-in tool reports per call.
TOOL_ITEMS: dict[str, dict[str, Any]] = {
    "web_search": {
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "fake"},
    },
    "file_search": {"type": "file_search_call", "status": "completed", "queries": ["fake"]},
    "code_interpreter": {
        "type": "code_interpreter_call",
        "status": "completed",
        "code": "print(1)",
        "container_id": "cntr_fake",
        "outputs": [],
    },
}


class FakeOpenAI(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.usage = dict(DEFAULT_USAGE)
        self.service_tier: str | None = None  # reported by every answer when set

    def error_json(self, status: int) -> dict[str, Any]:
        return {"error": {"message": f"fake {status}", "type": "fake_error", "code": None}}

    def chat_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]},
            "completion_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
        }

    def responses_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["cached_tokens"]},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
        }

    def _response(self, seen: Seen, text: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        searched = [
            {**item, "id": f"{name}_fake"}
            for tool in seen.body.get("tools") or []
            for name, item in TOOL_ITEMS.items()
            if str(tool.get("type", "")).startswith(name)
        ]
        return {
            **self._tier(),
            "id": "resp_fake",
            "object": "response",
            "created_at": 1,
            "model": seen.body.get("model"),
            "status": "completed",
            "output": [
                *searched,
                {
                    "type": "message",
                    "id": "msg_fake",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                },
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def _tier(self) -> dict[str, Any]:
        return {"service_tier": self.service_tier} if self.service_tier else {}

    def answer_json(self, seen: Seen, behaviour: Behaviour) -> dict[str, Any]:
        if seen.path.endswith("/responses"):
            return self._response(seen, behaviour.text, self.responses_usage())
        return {
            **self._tier(),
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": seen.body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": behaviour.text},
                    "finish_reason": behaviour.finish_reason,
                }
            ],
            "usage": self.chat_usage(),
        }

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        model = seen.body.get("model")
        if seen.path.endswith("/responses"):
            for n in range(behaviour.chunks):
                yield (
                    "response.output_text.delta",
                    json.dumps(
                        {
                            "type": "response.output_text.delta",
                            "item_id": "msg_fake",
                            "output_index": 0,
                            "content_index": 0,
                            "delta": behaviour.text,
                            "logprobs": [],
                            "sequence_number": n,
                        }
                    ),
                )
            yield (
                "response.completed",
                json.dumps(
                    {
                        "type": "response.completed",
                        "sequence_number": behaviour.chunks,
                        "response": self._response(
                            seen,
                            behaviour.text * behaviour.chunks,
                            self.responses_usage() if behaviour.usage else None,
                        ),
                    }
                ),
            )
            return
        for _ in range(behaviour.chunks):
            yield (
                "",
                json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": behaviour.text},
                                "finish_reason": None,
                            }
                        ],
                    }
                ),
            )
        if behaviour.usage and (seen.body.get("stream_options") or {}).get("include_usage"):
            yield (
                "",
                json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [],
                        "usage": self.chat_usage(),
                    }
                ),
            )
        yield "", "[DONE]"
