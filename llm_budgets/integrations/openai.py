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
responses and raw HTTP, batches, background responses...) raise ``NotGuarded``; what bills
nothing (files, models, moderations...) passes through untouched. docs/integrations.md has an
example of every path.

The client denies by default (:mod:`llm_budgets.integrations.proxy`): every attribute and every
parameter of a guarded method is classified here, and anything else is refused. The SDK's own
retries are made by the guard, one hold per attempt (``without_sdk_retries``).
"""

from __future__ import annotations

import logging
from typing import Any

import openai
from openai.resources import chat as chat_resources
from openai.resources import responses as responses_resources

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.guarding import (
    NEUTRAL_PARAMETERS,
    SEARCH_CONTENT_TOKENS_PER_USE,
    SWITCH_CHECK_SECONDS,
    Call,
    GuardOptions,
    NotGuarded,
    Parameters,
    SdkErrors,
    as_text_message,
    bound,
    given,
    json_text,
    refuse_media,
    refuse_priced_extra_body,
    text_of,
)
from llm_budgets.integrations.proxy import (
    CLIENT_CONFIG,
    RAW_HTTP,
    RAW_RESPONSES,
    ClientProxy,
    guarded_copy,
    unclassified,
)
from llm_budgets.integrations.streams import (
    AsyncStreamGuard,
    Sdk,
    SyncStreamGuard,
    asend,
    send,
)
from llm_budgets.usage import Usage, from_openai, usage_validate

__all__ = ["GuardedOpenAI", "guard"]

logger = logging.getLogger("llm_budgets")

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
# Names that pass through: they bill nothing (client configuration, files, model lists, free
# moderation, stored conversations and completions, webhooks' signature checks).
_CLIENT_CONFIG = CLIENT_CONFIG | {
    "admin_api_key",
    "organization",
    "project",
    "webhook_secret",
    "websocket_base_url",
    "workload_identity",
}
_FREE_RESOURCES = frozenset(
    {"files", "uploads", "models", "moderations", "conversations", "webhooks"}
)
# Refused on purpose: they cost money and the guard does not price them, or they send requests
# the guard cannot see (raw HTTP, raw responses).
_REFUSED_CLIENT = (
    frozenset(
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
            "vector_stores",
            "containers",
            "skills",
            "admin",
            "safety",
            "decisions",
            "content_provenance_checks",
        }
    )
    | RAW_HTTP
)
_RAW = RAW_RESPONSES


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
    return GuardedOpenAI(*guarded_copy(client, options, {"max_retries": client.max_retries}))


class _Proxy(ClientProxy):
    _sdk = "openai"
    _refused = _RAW
    _instead = _INSTEAD


class _ChatCompletions(_Proxy):
    # Stored completions: reading, listing, updating metadata and deleting bill nothing.
    _free = frozenset({"retrieve", "list", "update", "delete", "messages"})
    _refused = _RAW | {"stream"}

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
    # Reading, cancelling and deleting stored responses and counting input tokens bill nothing;
    # compaction runs the model and the WebSocket mode (connect) is not priced.
    _free = frozenset({"retrieve", "cancel", "delete", "input_items", "input_tokens"})
    _refused = _RAW | {"stream", "compact", "connect"}

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
    _free = _CLIENT_CONFIG | _FREE_RESOURCES
    _refused = _REFUSED_CLIENT

    def with_options(self, **kwargs: Any) -> GuardedOpenAI:
        return GuardedOpenAI(*guarded_copy(self._target, self._options, kwargs))

    copy = with_options


# The installed SDK's classes, by path from the client, that the proxies classify.
SDK_CLASSES: dict[str, tuple[type, ...]] = {
    "": (openai.OpenAI, openai.AsyncOpenAI),
    "chat": (chat_resources.Chat, chat_resources.AsyncChat),
    "chat.completions": (chat_resources.Completions, chat_resources.AsyncCompletions),
    "responses": (responses_resources.Responses, responses_resources.AsyncResponses),
}


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
    calls = {
        name: sum(_field(item, "type") == kind for item in items)
        for name, kind in SERVER_TOOLS.items()
    }
    calls = {name: count for name, count in calls.items() if count}
    if not writes and not calls:
        return counted
    return usage_validate(
        input_tokens=counted.input_tokens,
        output_tokens=counted.output_tokens,
        cached_input_tokens=counted.cached_input_tokens,
        cache_write_tokens=writes or 0,
        reasoning_tokens=counted.reasoning_tokens,
        tool_calls=calls or None,
    )


def _response_usage(result: object) -> Usage | None:
    return openai_usage(_field(result, "usage"), output=_field(result, "output"))


SDK = Sdk(
    stream=openai.Stream,
    async_stream=openai.AsyncStream,
    guarded_stream=GuardedStream,
    async_guarded_stream=AsyncGuardedStream,
    usage=_response_usage,
    note=lambda call, answer: _note_tier(call, answer),
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


# Service tiers billed at most the standard rates (flex costs less, and is held and charged as
# standard). Any other tier is held and charged at the price's rates for it (``service_tiers``),
# refused when the price has none; "auto" (the project's default) is checked against the tier
# the answer reports.
_STANDARD_TIERS = frozenset({"auto", "default", "flex"})
_AUDIO = (
    "Audio tokens are billed at audio rates the price table does not have: reserve yourself "
    "around the unguarded client."
)
CHAT_PARAMETERS = Parameters(
    priced=frozenset(
        {
            "model",
            "messages",
            "max_completion_tokens",
            "max_tokens",
            "n",
            "stream",
            "stream_options",
            "tools",
            "functions",
            "function_call",
            "response_format",
            "reasoning_effort",
            "service_tier",
            "modalities",
            "extra_body",
        }
    ),
    neutral=NEUTRAL_PARAMETERS,
    refused={
        "audio": _AUDIO,
        "web_search_options": (
            "Chat Completions web search has a per-call fee and search content the guard "
            "cannot bound: use responses.create with a web_search tool and max_tool_calls."
        ),
        "prediction": "Rejected prediction tokens are billed as output the guard cannot bound.",
        "moderation": "Not classified: the guard does not know what it costs.",
        "prompt_cache_options": "Not classified: the guard does not know what it costs.",
    },
)
RESPONSES_PARAMETERS = Parameters(
    priced=frozenset(
        {
            "model",
            "input",
            "instructions",
            "max_output_tokens",
            "max_tool_calls",
            "tools",
            "text",
            "text_format",
            "stream",
            "reasoning",
            "service_tier",
            "extra_body",
        }
    ),
    neutral=NEUTRAL_PARAMETERS | {"include", "truncation", "stream_options"},
    refused={
        "background": (
            "A background response finishes at the provider after the call returns, with no "
            "usage to settle on: call without background (stream=True for long answers)."
        ),
        "background_options": "Background responses are not guarded.",
        "previous_response_id": "It brings input the guard cannot count offline.",
        "conversation": "It brings input the guard cannot count offline.",
        "prompt": "A stored prompt brings input the guard cannot count offline.",
        "image": "Image input cannot be counted offline.",
        "context_management": "Server-side compaction runs the model again, unpriced.",
        "access_programs": "Not classified: the guard does not know what it costs.",
        "moderation": "Not classified: the guard does not know what it costs.",
        "prompt_cache_options": "Not classified: the guard does not know what it costs.",
        "parse_as": "Not classified: the guard does not know what it costs.",
    },
)
# Models that answer with what they show: every other OpenAI model is taken to reason unseen
# (o-series, gpt-5 and later, deployments with names of their own).
_NON_REASONING = ("gpt-4o", "gpt-4.1", "gpt-4-", "gpt-3.5", "chatgpt-4o")


def _may_reason(model: str, kwargs: dict[str, Any]) -> bool:
    """Whether ``model`` may bill reasoning tokens it never streams: asked for (a
    ``reasoning_effort`` or ``reasoning``), or not a model known to answer without them."""
    if given(kwargs.get("reasoning_effort")) or given(kwargs.get("reasoning")):
        return True
    name = model.rsplit("/", 1)[-1]
    return not (name == "gpt-4" or name.startswith(_NON_REASONING))


def _service_tier(kwargs: dict[str, Any]) -> str:
    """The premium tier to hold and charge at (``""``: standard); audio output refused."""
    modalities = kwargs.get("modalities")
    if isinstance(modalities, list | tuple) and "audio" in modalities:
        raise NotGuarded("openai modalities=['audio']", instead=_AUDIO)
    tier = kwargs.get("service_tier")
    return str(tier) if given(tier) and tier not in _STANDARD_TIERS else ""


def _chat_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    CHAT_PARAMETERS.check(kwargs, where="openai chat.completions.create")
    refuse_priced_extra_body(kwargs)
    tier = _service_tier(kwargs)
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
        refuse_media(message.get("audio"), field_name="messages")
        if message.get("audio"):  # an earlier audio answer, referred to by id
            raise NotGuarded("openai messages with audio", instead=_AUDIO)
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
        service_tier=tier,
    )


def _chat_send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    call.reasons = _may_reason(call.model_sent, kwargs)
    # The held ceiling in the parameter the caller used (both, if both were given).
    if given(kwargs.get("max_tokens")):
        sent["max_tokens"] = call.ceiling_sent
    if given(kwargs.get("max_completion_tokens")) or not given(kwargs.get("max_tokens")):
        sent["max_completion_tokens"] = call.ceiling_sent
    if kwargs.get("stream") is True:
        stream_options = dict(kwargs.get("stream_options") or {})
        # The guard needs the usage chunk; a caller who did not ask for it never sees it.
        call.state["hide_usage"] = stream_options.get("include_usage") is not True
        stream_options["include_usage"] = True
        sent["stream_options"] = stream_options
    return sent


def _observe_chat(call: Call, chunk: Any) -> bool:
    """Count a chunk; False for the usage chunk the caller did not ask for (hidden)."""
    assert call.counter is not None
    _note_tier(call, chunk)
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
        if call.state.get("hide_usage") and not getattr(chunk, "choices", None):
            return False
    return True


def _note_tier(call: Call, answer: object) -> None:
    call.answered_at_tier(_field(answer, "service_tier"), standard=_STANDARD_TIERS)


# -- responses ---------------------------------------------------------------------------------


def _responses_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    RESPONSES_PARAMETERS.check(kwargs, where="openai responses.create")
    refuse_priced_extra_body(kwargs)
    tier = _service_tier(kwargs)
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
            else:  # tool calls and their outputs, reasoning items: files and images refused
                refuse_media([item], field_name="input")
                messages.append(as_text_message("user", json_text(item)))
    if not messages:
        raise InvalidUsage("input is required.", field="input")
    for name in ("tools", "text", "text_format"):
        if given(kwargs.get(name)):
            messages.append(as_text_message("system", _schema_text(kwargs[name])))
    ceiling = kwargs.get("max_output_tokens")
    tool_calls = _server_tools(kwargs)
    return Call(
        options=options,
        model=_model(kwargs),
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
        max_tool_calls=tool_calls,
        service_tier=tier,
        extra_input_tokens=sum(
            SEARCH_CONTENT_TOKENS_PER_USE * calls
            for name, calls in (tool_calls or {}).items()
            if name in _SEARCHES
        ),
    )


# Built-in tools the provider runs (with a fee per call where the price lists one), by the
# name their fee has in the price table; the output item each call reports. Other built-in
# tools (MCP, computer use, shell...) are refused.
SERVER_TOOLS = {
    "web_search": "web_search_call",
    "file_search": "file_search_call",
    "code_interpreter": "code_interpreter_call",
    "image_generation": "image_generation_call",
}
_CLIENT_TOOLS = frozenset({"function", "custom"})
# The tools whose results are billed as input of the call (held per call).
_SEARCHES = frozenset({"web_search", "file_search"})


def _server_tools(kwargs: dict[str, Any]) -> dict[str, int] | None:
    """Each built-in tool held at ``max_tool_calls`` calls (the bound is shared by all of them,
    so each is held at the whole bound), required when there is one."""
    tools: list[Any] = list(kwargs["tools"]) if given(kwargs.get("tools")) else []
    held: dict[str, int] = {}
    for tool in tools:
        kind = str(_field(tool, "type") or "")
        if kind in _CLIENT_TOOLS:
            continue
        name = next((n for n in SERVER_TOOLS if kind.startswith(n)), None)
        if name is None:
            raise NotGuarded(
                f"openai responses tool {kind!r}",
                instead="Only function tools and web_search, file_search, code_interpreter and "
                "image_generation (with max_tool_calls) are priced.",
            )
        calls = bound(kwargs.get("max_tool_calls"))
        if calls is None:
            raise InvalidUsage(
                f"a {name} tool needs max_tool_calls: each call is charged a fee, and "
                "without a bound the worst case cannot be held.",
                field="max_tool_calls",
            )
        held[name] = calls
    return held or None


def _responses_send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    call.reasons = _may_reason(call.model_sent, kwargs)
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


def _observe_responses(call: Call, event: Any) -> bool:
    assert call.counter is not None
    kind = getattr(event, "type", "")
    if kind in _RESPONSE_TEXT_EVENTS:
        call.counter.add(getattr(event, "delta", None) or "")
    elif kind in _RESPONSE_FINAL_EVENTS:
        response = getattr(event, "response", None)
        _note_tier(call, response)
        usage = _response_usage(response)
        if usage is not None:
            call.final_usage = usage
    return True


# Checked against the installed SDK at import: what it has that the guard does not classify is
# refused (deny by default), logged here, and fails tests/test_integrations_coverage.py.
UNCLASSIFIED = unclassified(GuardedOpenAI, SDK_CLASSES)
UNCLASSIFIED_PARAMETERS = {
    where: missing
    for where, parameters, method in (
        ("chat.completions.create", CHAT_PARAMETERS, chat_resources.Completions.create),
        ("chat.completions.parse", CHAT_PARAMETERS, chat_resources.Completions.parse),
        ("responses.create", RESPONSES_PARAMETERS, responses_resources.Responses.create),
        ("responses.parse", RESPONSES_PARAMETERS, responses_resources.Responses.parse),
    )
    if (missing := parameters.unclassified(method))
}
if UNCLASSIFIED or UNCLASSIFIED_PARAMETERS:
    logger.warning(
        "llm_budgets: openai %s has attributes %s and parameters %s the guard does not "
        "classify; they are refused (NotGuarded).",
        openai.__version__,
        UNCLASSIFIED,
        UNCLASSIFIED_PARAMETERS,
    )
