"""OpenAI's shapes: Chat Completions and Responses, JSON and SSE, with usage as OpenAI sends it
(``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``; in a
stream, a last chunk with ``choices: []`` and the usage, only when ``include_usage`` is asked),
the ``service_tier`` the answer was served at when one is set, and an output item per built-in
tool of a Responses request (the calls it made), as OpenAI reports them. A reasoning model
streams no reasoning: its deltas are the visible answer only.

``FakeOpenAI(realistic=True)`` answers with the usage the request makes OpenAI bill, by the rules
in :mod:`llm_budgets.testing.fakes.bills` (text, images, audio, stored context, server tools and
their results, reasoning, ``n``, the service tier billed), and records each request's bill
(``fake.bills``, ``seen.bill``). Otherwise it answers ``fake.usage`` as given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from llm_budgets.testing.fakes import bills
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


# What a realistic fake assumes where the request does not say (each a knob on the fake).
DEFAULT_CEILING = 4096
STORED_CONTEXT_TOKENS = 30_000  # a conversation or stored prompt the fake did not record
SEARCH_RESULT_TOKENS = 8_000  # search content billed as input, per search
CODE_OUTPUT_TOKENS = 6_000  # code-interpreter output fed back to the model as input
# Models that reason unseen (everything but the gpt-4o / gpt-4.1 families, here).
_ANSWERS_PLAINLY = ("gpt-4o", "gpt-4.1", "text-embedding", "omni-moderation")


def _ceiling(body: dict[str, Any]) -> int:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        if isinstance(body.get(name), int):
            return int(body[name])
    return bills.MAX_OUTPUT.get(str(body.get("model", "")), DEFAULT_CEILING)


def _reasons(body: dict[str, Any]) -> bool:
    model = str(body.get("model", ""))
    asked = body.get("reasoning_effort") or body.get("reasoning")
    return bool(asked) or not model.startswith(_ANSWERS_PLAINLY)


def _output_text_deltas(behaviour: Behaviour) -> Iterator[tuple[str, str]]:
    """A Responses stream's text: ``behaviour.chunks`` deltas of ``behaviour.text``."""
    for n in range(behaviour.chunks):
        delta = {
            "type": "response.output_text.delta",
            "item_id": "msg_fake",
            "output_index": 0,
            "content_index": 0,
            "delta": behaviour.text,
            "logprobs": [],
            "sequence_number": n,
        }
        yield "response.output_text.delta", json.dumps(delta)


class _Plan:
    """What a realistic answer will be: its usage, tier, tool calls and text."""

    def __init__(self, fake: FakeOpenAI, seen: Seen, behaviour: Behaviour) -> None:
        body = seen.body
        self.model = str(body.get("model", ""))
        self.responses = seen.path.endswith("/responses")
        self.text = behaviour.text * behaviour.chunks
        ceiling = _ceiling(body)
        self.n = int(body.get("n") or 1)
        if self.responses:
            counted = bills.openai_responses_input(body, fake.image_sizes)
        else:
            counted = bills.openai_chat_input(body, fake.image_sizes)
        input_tokens = counted.total + self._stored(fake, body)
        self.tool_items: list[dict[str, Any]] = []
        tool_calls: dict[str, int] = {}
        for tool in body.get("tools") or []:
            kind = str(tool.get("type", ""))
            name = next((n for n in TOOL_ITEMS if kind.startswith(n)), None)
            if name is None:
                continue
            # The worst case: as many calls as the request allows.
            calls = 1 if name == "code_interpreter" else int(body.get("max_tool_calls") or 1)
            tool_calls[name] = tool_calls.get(name, 0) + calls
            per_call = (
                fake.code_output_tokens if name == "code_interpreter" else fake.search_result_tokens
            )
            input_tokens += calls * per_call
            self.tool_items += [{**TOOL_ITEMS[name], "id": f"{name}_{i}"} for i in range(calls)]
        if body.get("web_search_options") is not None:  # chat search: one search, its content
            tool_calls["web_search_preview_chat"] = 1
            input_tokens += fake.search_result_tokens
        visible = min(bills.text_tokens(self.text), ceiling)
        reasoning = ceiling - visible if _reasons(body) else 0
        audio = 0
        if "audio" in (body.get("modalities") or []):  # the spoken answer: 8 tokens a word
            audio = min(ceiling - visible, 8 * visible)
        rejected = 0
        prediction = body.get("prediction")
        if isinstance(prediction, dict):  # worst case: every predicted token rejected
            rejected = bills.text_tokens(json.dumps(prediction.get("content")))
        self.rejected = rejected
        self.visible = visible
        self.usage = bills.Usage(
            input_tokens=input_tokens,
            audio_input_tokens=counted.audio,
            output_tokens=self.n * (visible + reasoning + audio) + rejected,
            reasoning_tokens=self.n * reasoning,
            audio_output_tokens=self.n * audio,
            tool_calls=tool_calls,
        )
        asked = body.get("service_tier")
        self.tier = asked if asked in {"priority", "flex"} else fake.project_tier
        self.modifiers: tuple[str, ...] = (self.tier,) if self.tier in {"priority", "flex"} else ()
        if self.model.startswith(("text-embedding", "omni-moderation")):
            self.usage = bills.Usage(input_tokens=input_tokens)
        fake._ids += 1
        self.id = f"resp_{fake._ids}"

    def _stored(self, fake: FakeOpenAI, body: dict[str, Any]) -> int:
        """Input the request names but does not carry: earlier turns, a conversation, a
        stored prompt."""
        tokens = 0
        previous = body.get("previous_response_id")
        if previous:
            earlier_in, earlier_out = fake.stored.get(str(previous), (STORED_CONTEXT_TOKENS, 0))
            tokens += earlier_in + earlier_out
        conversation = body.get("conversation")
        if conversation:
            key = conversation if isinstance(conversation, str) else conversation.get("id")
            tokens += fake.conversations.get(str(key), STORED_CONTEXT_TOKENS)
        prompt = body.get("prompt")
        if prompt:
            tokens += fake.prompts.get(str(prompt.get("id")), STORED_CONTEXT_TOKENS)
        return tokens

    def bill(self, *, sent: str | None = None) -> bills.Bill:
        """The bill; ``sent``: the visible text a cut stream got out (reasoning and tool work
        done before it are billed in full)."""
        usage = self.usage
        if sent is not None:
            shown = bills.text_tokens(sent)
            usage = bills.Usage(
                **{
                    **usage.__dict__,
                    "output_tokens": usage.output_tokens - self.n * self.visible + shown,
                }
            )
        return bills.bill("openai", self.model, usage, modifiers=self.modifiers)

    def chat_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": u.audio_input_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": u.reasoning_tokens,
                "audio_tokens": u.audio_output_tokens,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": self.rejected,
            },
        }

    def responses_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.input_tokens + u.output_tokens,
        }


class FakeOpenAI(FakeProvider):
    def __init__(self, *, realistic: bool = False) -> None:
        super().__init__()
        self.usage = dict(DEFAULT_USAGE)
        self.service_tier: str | None = None  # reported by every answer when set
        self.realistic = realistic
        self.bills: list[bills.Bill] = []
        # The realistic fake's state and knobs.
        self.project_tier = "default"  # the tier "auto" (or no tier) is billed at
        self.stored: dict[str, tuple[int, int]] = {}  # response id -> (input, output) tokens
        self.conversations: dict[str, int] = {}  # conversation id -> its tokens
        self.prompts: dict[str, int] = {}  # stored prompt id -> its tokens
        self.search_result_tokens = SEARCH_RESULT_TOKENS
        self.code_output_tokens = CODE_OUTPUT_TOKENS
        self.image_sizes: dict[str, tuple[int, int]] = {}
        self._ids = 0

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
        if self.realistic:
            return self._realistic_json(seen, behaviour)
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

    def _responses_opening(
        self, seen: Seen, response_id: str = "resp_fake"
    ) -> Iterator[tuple[str, str]]:
        """A Responses stream opens as OpenAI's does: ``response.created`` (under the id the
        stream completes with), the message item and its text part (the SDK's
        ``responses.stream()`` helper needs them)."""
        created = {
            **self._response(seen, "", None),
            "id": response_id,
            "status": "in_progress",
            "output": [],
        }
        item = {
            "type": "message",
            "id": "msg_fake",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": []}
        for kind, fields in (
            ("response.created", {"response": created}),
            ("response.output_item.added", {"output_index": 0, "item": item}),
            (
                "response.content_part.added",
                {"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part},
            ),
        ):
            yield kind, json.dumps({"type": kind, "sequence_number": 0, **fields})

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        if self.realistic:
            yield from self._realistic_events(seen, behaviour)
            return
        model = seen.body.get("model")
        if seen.path.endswith("/responses"):
            yield from self._responses_opening(seen)
            yield from _output_text_deltas(behaviour)
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

    # -- the realistic fake: usage from the request, and its bill ----------------------------

    def _plan(self, seen: Seen, behaviour: Behaviour) -> _Plan:
        plan = _Plan(self, seen, behaviour)
        seen.plan = plan
        return plan

    def _realistic_json(self, seen: Seen, behaviour: Behaviour) -> dict[str, Any]:
        p = self._plan(seen, behaviour)
        if seen.path.endswith("/embeddings"):
            inputs = seen.body.get("input")
            count = len(inputs) if isinstance(inputs, list) else 1
            return {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.0, 0.1]}
                    for i in range(count)
                ],
                "model": p.model,
                "usage": {
                    "prompt_tokens": p.usage.input_tokens,
                    "total_tokens": p.usage.input_tokens,
                },
            }
        if seen.path.endswith("/moderations"):
            return {"id": "modr_fake", "model": p.model, "results": []}
        if p.responses:
            answer = self._response(seen, p.text, p.responses_usage())
            answer["id"] = p.id
            answer["service_tier"] = p.tier
            answer["output"] = [*p.tool_items, answer["output"][-1]]
            return answer
        return {
            "service_tier": p.tier,
            "id": p.id,
            "object": "chat.completion",
            "created": 1,
            "model": p.model,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": p.text},
                    "finish_reason": behaviour.finish_reason,
                }
                for i in range(p.n)
            ],
            "usage": p.chat_usage(),
        }

    def _realistic_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        p = self._plan(seen, behaviour)
        if p.responses:
            yield from self._responses_opening(seen, p.id)
            yield from _output_text_deltas(behaviour)
            answer = self._response(seen, p.text, p.responses_usage() if behaviour.usage else None)
            answer.update(
                id=p.id, service_tier=p.tier, output=[*p.tool_items, answer["output"][-1]]
            )
            yield (
                "response.completed",
                json.dumps(
                    {
                        "type": "response.completed",
                        "sequence_number": behaviour.chunks,
                        "response": answer,
                    }
                ),
            )
            return
        chunk = {
            "id": p.id,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": p.model,
            "service_tier": p.tier,
        }
        for _ in range(behaviour.chunks):
            for i in range(p.n):
                yield (
                    "",
                    json.dumps(
                        {
                            **chunk,
                            "choices": [
                                {
                                    "index": i,
                                    "delta": {"content": behaviour.text},
                                    "finish_reason": None,
                                }
                            ],
                        }
                    ),
                )
        if behaviour.usage and (seen.body.get("stream_options") or {}).get("include_usage"):
            yield "", json.dumps({**chunk, "choices": [], "usage": p.chat_usage()})
        yield "", "[DONE]"

    def event_text(self, event: str, data: str) -> str:
        if not self.realistic or data == "[DONE]":
            return ""
        payload = json.loads(data)
        if event == "response.output_text.delta":
            return str(payload.get("delta", ""))
        return "".join(
            str((choice.get("delta") or {}).get("content") or "")
            for choice in payload.get("choices") or []
        )

    def billed(self, seen: Seen, *, cut: bool) -> None:
        p = seen.plan
        if not self.realistic or p is None:
            return
        seen.bill = p.bill(sent=seen.text_sent if cut else None)
        if p.responses and seen.body.get("store", True) is not False:
            self.stored[p.id] = (p.usage.input_tokens, p.usage.output_tokens)
        self.bills.append(seen.bill)
