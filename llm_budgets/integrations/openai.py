"""A one-line guard for the official ``openai`` SDK (``pip install llm-budgets[openai]``).

.. code-block:: python

    from llm_budgets.integrations.openai import guard

    client = guard(openai.OpenAI(), tenant="acme", end_user="u-1", tags={"feature": "chat"})
    client.chat.completions.create(model="gpt-4o", messages=[...], max_completion_tokens=500)

``client.chat.completions.create`` and ``client.responses.create`` (plain and ``stream=True``,
on ``OpenAI`` and ``AsyncOpenAI``) are admitted, sent with the model and output ceiling that were
held, and settled from the response's usage (see :mod:`llm_budgets.integrations.guarding` for
every way a call can end). Streams ask for usage (``stream_options={"include_usage": True}``).
``parse`` (structured outputs) is guarded like ``create``. Calls that cost money but cannot be
priced (embeddings, images, audio, the legacy completions, the ``stream`` helpers, raw
responses, batches...) raise ``NotGuarded``; everything else
(files, models, moderations...) passes through untouched. docs/integrations.md has an example of
every path.
"""

from __future__ import annotations

from typing import Any

import openai

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.guarding import (
    SWITCH_CHECK_SECONDS,
    Call,
    GuardOptions,
    SdkErrors,
    as_text_message,
    given,
    json_text,
    refuse_priced_extra_body,
    text_of,
)
from llm_budgets.integrations.proxy import ClientProxy
from llm_budgets.integrations.streams import (
    AsyncStreamGuard,
    Sdk,
    SyncStreamGuard,
    asend,
    send,
)
from llm_budgets.usage import Usage, from_openai, usage_validate

__all__ = ["GuardedOpenAI", "guard"]

ERRORS = SdkErrors(
    status=openai.APIStatusError,
    timeout=openai.APITimeoutError,
    connection=openai.APIConnectionError,
)
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})
_INSTEAD = (
    "Reserve with budgets.reserve(...) and call the unguarded client inside the with-block, "
    "or use chat.completions.create / responses.create."
)
# Attributes (by path from the client) that cost money and are not priced by the guard.
_REFUSED = frozenset(
    {
        "completions",
        "embeddings",
        "images",
        "audio",
        "batches",
        "fine_tuning",
        "realtime",
        "videos",
        "beta",
        "evals",
        "live",
        "with_raw_response",
        "with_streaming_response",
        "chat.with_raw_response",
        "chat.with_streaming_response",
        "chat.completions.stream",
        "chat.completions.with_raw_response",
        "chat.completions.with_streaming_response",
        "responses.stream",
        "responses.with_raw_response",
        "responses.with_streaming_response",
    }
)


def guard(
    client: openai.OpenAI | openai.AsyncOpenAI,
    *,
    tenant: str,
    end_user: str | None = None,
    tags: dict[str, str] | None = None,
    allow_degrade: bool = False,
    provider: str = "openai",
    ttl: int | None = None,
    switch_check_seconds: float = SWITCH_CHECK_SECONDS,
) -> Any:
    """Wrap ``client`` so every priced call is admitted and settled against ``tenant``'s
    budgets. ``provider``: whose prices apply (e.g. ``"azure"`` for an Azure endpoint).
    ``allow_degrade``: the plan's degradation ladder may change the model and the ceiling sent.
    ``switch_check_seconds``: how often a running stream looks for a kill switch (default 0.5).
    The result has the client's own call shapes and return types."""
    options = GuardOptions(
        tenant=tenant,
        end_user=end_user,
        tags=tags,
        allow_degrade=allow_degrade,
        provider=provider,
        ttl=ttl,
        switch_check_seconds=switch_check_seconds,
    )
    return GuardedOpenAI(client, options)


class _Proxy(ClientProxy):
    _sdk = "openai"
    _refused = _REFUSED
    _instead = _INSTEAD


class _ChatCompletions(_Proxy):
    def create(self, **kwargs: Any) -> Any:
        call = _chat_call(self._options, kwargs)
        if self.is_async:
            return asend(SDK, self._target.create, call, kwargs, _chat_send, _observe_chat)
        return send(SDK, self._target.create, call, kwargs, _chat_send, _observe_chat)

    def parse(self, **kwargs: Any) -> Any:
        """``parse`` (structured outputs) with ``response_format`` a type: guarded as
        ``create``; the schema the SDK sends is counted as input."""
        call = _chat_call(self._options, kwargs)
        if self.is_async:
            return asend(SDK, self._target.parse, call, kwargs, _chat_send, _observe_chat)
        return send(SDK, self._target.parse, call, kwargs, _chat_send, _observe_chat)


class _Chat(_Proxy):
    _children = {"completions": _ChatCompletions}


class _Responses(_Proxy):
    def create(self, **kwargs: Any) -> Any:
        call = _responses_call(self._options, kwargs)
        if self.is_async:
            return asend(
                SDK, self._target.create, call, kwargs, _responses_send, _observe_responses
            )
        return send(SDK, self._target.create, call, kwargs, _responses_send, _observe_responses)

    def parse(self, **kwargs: Any) -> Any:
        """``parse`` with ``text_format`` a type: guarded as ``create``."""
        call = _responses_call(self._options, kwargs)
        method = self._target.parse
        if self.is_async:
            return asend(SDK, method, call, kwargs, _responses_send, _observe_responses)
        return send(SDK, method, call, kwargs, _responses_send, _observe_responses)


class GuardedOpenAI(_Proxy):
    """An ``OpenAI`` / ``AsyncOpenAI`` client whose priced calls go through the guard."""

    _children = {"chat": _Chat, "responses": _Responses}

    def with_options(self, **kwargs: Any) -> GuardedOpenAI:
        return GuardedOpenAI(self._target.with_options(**kwargs), self._options)

    copy = with_options


# -- the stream classes: guarded, and still the SDK's own --------------------------------------


class GuardedStream(SyncStreamGuard, openai.Stream):
    """An ``openai.Stream`` whose chunks pass through the guard's accounting."""


class AsyncGuardedStream(AsyncStreamGuard, openai.AsyncStream):
    """An ``openai.AsyncStream`` whose chunks pass through the guard's accounting."""


def openai_usage(usage: object, *, output: object = None) -> Usage | None:
    """OpenAI's usage (Chat Completions or Responses) in the app's convention, with cache writes
    (``prompt_tokens_details.cache_write_tokens``) when the API reports them, and a Responses
    ``output``'s web searches (``web_search_call`` items) as tool calls."""
    if usage is None:
        return None
    counted = from_openai(usage)
    writes = _field(_field(usage, "prompt_tokens_details"), "cache_write_tokens") or _field(
        _field(usage, "input_tokens_details"), "cache_write_tokens"
    )
    items: list[Any] = list(output) if isinstance(output, list | tuple) else []
    searches = sum(_field(item, "type") == "web_search_call" for item in items)
    if not writes and not searches:
        return counted
    return usage_validate(
        input_tokens=counted.input_tokens,
        output_tokens=counted.output_tokens,
        cached_input_tokens=counted.cached_input_tokens,
        cache_write_tokens=writes or 0,
        reasoning_tokens=counted.reasoning_tokens,
        tool_calls={"web_search": searches} if searches else None,
    )


def _response_usage(result: object) -> Usage | None:
    return openai_usage(_field(result, "usage"), output=_field(result, "output"))


SDK = Sdk(
    stream=openai.Stream,
    async_stream=openai.AsyncStream,
    guarded_stream=GuardedStream,
    async_guarded_stream=AsyncGuardedStream,
    usage=_response_usage,
)


# -- calling -----------------------------------------------------------------------------------


def _field(obj: object, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _schema_text(value: object) -> str:
    """What a tool list, response format or structured-output type is sent as: a type (a
    pydantic model, a dataclass) as its JSON schema, anything else as its JSON."""
    if isinstance(value, type):
        try:
            import pydantic

            return json_text(pydantic.TypeAdapter(value).json_schema())
        except Exception:  # an unusual type: counted by its name; the SDK decides if it is valid
            return value.__name__
    return json_text(value)


# -- chat completions --------------------------------------------------------------------------


def _model(kwargs: dict[str, Any]) -> str:
    model = kwargs.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidUsage("model is required.", field="model")
    return model


def _chat_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    refuse_priced_extra_body(kwargs)
    if given(kwargs.get("n")) and kwargs["n"] != 1:
        raise InvalidUsage(
            "n must be 1 through the guard: each choice can use the whole output ceiling, so "
            "n choices are n calls; make them one at a time.",
            field="n",
        )
    messages = []
    for message in kwargs.get("messages") or []:
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidUsage('each message needs a "role".', field="messages")
        text = text_of(message.get("content"), field_name="messages", text_types=_TEXT_PARTS)
        if message.get("tool_calls"):
            text += json_text(message["tool_calls"])
        if message.get("name"):
            text = f"{message['name']}: {text}"
        messages.append(as_text_message(str(message["role"]), text))
    for name in ("tools", "functions", "response_format"):
        if given(kwargs.get(name)):
            messages.append(as_text_message("system", _schema_text(kwargs[name])))
    ceiling = kwargs.get("max_completion_tokens")
    if not given(ceiling):
        ceiling = kwargs.get("max_tokens")
    return Call(
        options=options,
        model=_model(kwargs),
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
    )


def _chat_send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    # The held ceiling in the parameter the caller used (both, if both were given).
    if given(kwargs.get("max_tokens")):
        sent["max_tokens"] = call.ceiling_sent
    if given(kwargs.get("max_completion_tokens")) or not given(kwargs.get("max_tokens")):
        sent["max_completion_tokens"] = call.ceiling_sent
    if kwargs.get("stream") is True:
        stream_options = dict(kwargs.get("stream_options") or {})
        stream_options["include_usage"] = True
        sent["stream_options"] = stream_options
    return sent


def _observe_chat(call: Call, chunk: Any) -> None:
    assert call.counter is not None
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        call.counter.add(getattr(delta, "content", None) or "")
        call.counter.add(getattr(delta, "refusal", None) or "")
        for tool_call in getattr(delta, "tool_calls", None) or []:
            function = getattr(tool_call, "function", None)
            call.counter.add(getattr(function, "arguments", None) or "")
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        call.final_usage = openai_usage(usage)


# -- responses ---------------------------------------------------------------------------------


def _responses_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    refuse_priced_extra_body(kwargs)
    for name in ("previous_response_id", "conversation", "prompt"):
        if given(kwargs.get(name)):
            raise InvalidUsage(
                f"{name} brings input the guard cannot count offline before the call; send "
                "the input itself, or reserve with budgets.reserve(input_tokens=...) around the "
                "unguarded client.",
                field=name,
            )
    messages = []
    if given(kwargs.get("instructions")):
        messages.append(as_text_message("system", str(kwargs["instructions"])))
    given_input = kwargs.get("input")
    if isinstance(given_input, str):
        messages.append(as_text_message("user", given_input))
    elif isinstance(given_input, list | tuple):
        for item in given_input:
            if not isinstance(item, dict):
                raise InvalidUsage("each input item must be an object.", field="input")
            if "role" in item:
                text = text_of(item.get("content"), field_name="input", text_types=_TEXT_PARTS)
                messages.append(as_text_message(str(item["role"]), text))
            else:
                messages.append(as_text_message("user", json_text(item)))
    if not messages:
        raise InvalidUsage("input is required.", field="input")
    for name in ("tools", "text", "text_format"):
        if given(kwargs.get(name)):
            messages.append(as_text_message("system", _schema_text(kwargs[name])))
    ceiling = kwargs.get("max_output_tokens")
    searches = None
    tools: list[Any] = list(kwargs["tools"]) if given(kwargs.get("tools")) else []
    if any(str(_field(tool, "type") or "").startswith("web_search") for tool in tools):
        bound = kwargs.get("max_tool_calls")
        if not given(bound) or isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise InvalidUsage(
                "a web_search tool needs max_tool_calls: each search is charged a fee, and "
                "without a bound the worst case cannot be held.",
                field="max_tool_calls",
            )
        searches = {"web_search": bound}
    return Call(
        options=options,
        model=_model(kwargs),
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
        max_tool_calls=searches,
    )


def _responses_send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    sent["max_output_tokens"] = call.ceiling_sent
    return sent


_RESPONSE_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    }
)
_RESPONSE_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _observe_responses(call: Call, event: Any) -> None:
    assert call.counter is not None
    kind = getattr(event, "type", "")
    if kind in _RESPONSE_TEXT_EVENTS:
        call.counter.add(getattr(event, "delta", None) or "")
    elif kind in _RESPONSE_FINAL_EVENTS:
        usage = _response_usage(getattr(event, "response", None))
        if usage is not None:
            call.final_usage = usage
