"""A one-line guard for the official ``openai`` SDK (``pip install llm-budgets[openai]``).

.. code-block:: python

    from llm_budgets.integrations.openai import guard

    client = guard(openai.OpenAI(), tenant="acme", end_user="u-1", tags={"feature": "chat"})
    client.chat.completions.create(model="gpt-4o", messages=[...], max_completion_tokens=500)

``client.chat.completions.create`` and ``client.responses.create`` (plain and ``stream=True``,
on ``OpenAI`` and ``AsyncOpenAI``) are admitted, sent with the model and output ceiling that were
held, and settled from the response's usage (see :mod:`llm_budgets.integrations.guarding` for
every way a call can end). Streams ask for usage (``stream_options={"include_usage": True}``).
``parse`` (structured outputs) and the ``stream()`` helpers are guarded like ``create`` (they
call it); ``embeddings.create`` is priced by its input. What can be bounded is held at its worst
case (images by OpenAI's published rule, ``n`` choices as n outputs, stored context at the
model's context window, an omitted ceiling at the model's maximum). Calls that cost money but
cannot be priced (image generation, audio, the legacy completions, raw responses and raw HTTP,
batches, background responses...) raise ``NotGuarded``; what bills nothing (files, models,
moderations...) passes through untouched. docs/integrations.md has an example of every path.

The client denies by default (:mod:`llm_budgets.integrations.proxy`): every attribute and every
parameter of a guarded method is classified here, and anything else is refused. The SDK's own
retries are made by the guard, one hold per attempt (``without_sdk_retries``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, cast

import openai
from asgiref.sync import sync_to_async
from django.utils import timezone
from openai.resources import chat as chat_resources
from openai.resources import embeddings as embeddings_resources
from openai.resources import responses as responses_resources
from openai.resources.chat.completions import completions as chat_module
from openai.resources.responses import responses as responses_module

from llm_budgets.db.boundary import ledger_guard
from llm_budgets.exceptions import InvalidUsage, UnknownPrice
from llm_budgets.integrations.chains import chain_record, chain_tokens
from llm_budgets.integrations.guarding import (
    NEUTRAL_PARAMETERS,
    RESULT_TOKENS_PER_USE,
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
    text_of,
    with_extra_body,
)
from llm_budgets.integrations.images import data_url_size, openai_image_tokens
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
    Observe,
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
# Moderations bill nothing (OpenAI's moderation endpoint is free): they pass through unrecorded.
# Refused on purpose: they cost money and the guard does not price them, or they send requests
# the guard cannot see (raw HTTP, raw responses).
_REFUSED_CLIENT = (
    frozenset(
        {
            "completions",
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
    project_tier: str = "",
) -> Any:
    """Wrap ``client`` so every priced call is admitted and settled against ``tenant``'s
    budgets. ``provider``: whose prices apply (e.g. ``"azure"`` for an Azure endpoint).
    ``allow_degrade``: the plan's degradation ladder may change the model and the ceiling sent.
    ``switch_check_seconds``: how often a running stream looks for a kill switch (default 0.5).
    ``project_tier``: the service tier the OpenAI project bills a call that asks for none (or
    ``"auto"``) at, when its default is not the standard one (``"priority"``): such calls are
    held at it, and charged at the tier each answer reports.
    The result has the client's own call shapes and return types."""
    options = OpenAIGuardOptions(
        tenant=tenant,
        end_user=end_user,
        tags=tags,
        allow_degrade=allow_degrade,
        provider=provider,
        ttl=ttl,
        switch_check_seconds=switch_check_seconds,
        project_tier=project_tier,
    )
    return GuardedOpenAI(*guarded_copy(client, options, {"max_retries": client.max_retries}))


@dataclass(frozen=True)
class OpenAIGuardOptions(GuardOptions):
    """``GuardOptions`` and the project's default service tier (``guard(project_tier=...)``)."""

    project_tier: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.project_tier, str) or self.project_tier in _STANDARD_TIERS:
            raise InvalidUsage(
                'project_tier must be a premium tier such as "priority", or "" (standard).',
                field="project_tier",
            )


class _Proxy(ClientProxy):
    _sdk = "openai"
    _refused = _RAW
    _instead = _INSTEAD


def _guarded(proxy: _Proxy, method: Any, call: Call, kwargs: dict[str, Any], kind: _Kind) -> Any:
    """Send ``call`` through ``method``: the model's limits read first where the request leaves
    something to them (in a thread for async clients, as admission is)."""
    if proxy.is_async:
        return _asend_bounded(method, call, kwargs, kind)
    pin = partial(kind.pin, model_ceiling=_bound_by_model(call))
    return send(kind.sdk, method, call, kwargs, pin, kind.observe)


async def _asend_bounded(method: Any, call: Call, kwargs: dict[str, Any], kind: _Kind) -> Any:
    model_ceiling = None
    if _LEFT_TO_MODEL in call.state:  # a thread only when the ledger must be read
        model_ceiling = await sync_to_async(_bound_by_model)(call)
    pin = partial(kind.pin, model_ceiling=model_ceiling)
    return await asend(kind.sdk, method, call, kwargs, pin, kind.observe)


class _ChatCompletions(_Proxy):
    # Stored completions: reading, listing, updating metadata and deleting bill nothing.
    _free = frozenset({"retrieve", "list", "update", "delete", "messages"})

    def create(self, **kwargs: Any) -> Any:
        call, kind = _chat_call(self._options, kwargs)
        return _guarded(self, self._target.create, call, kwargs, kind)

    def parse(self, **kwargs: Any) -> Any:
        """``parse`` (structured outputs) with ``response_format`` a type: guarded as
        ``create``; the schema the SDK sends is counted as input."""
        call, kind = _chat_call(self._options, kwargs)
        return _guarded(self, self._target.parse, call, kwargs, kind)

    def stream(self, **kwargs: Any) -> Any:
        """The SDK's ``stream()`` helper, its own stream manager, whose request is this guarded
        ``create(stream=True)``: the same rules, held when the manager is entered."""
        helper = chat_module.async_stream if self.is_async else chat_module.stream
        return helper(cast(Any, self), **kwargs)


class _Chat(_Proxy):
    _children = {"completions": _ChatCompletions}


class _Responses(_Proxy):
    # Reading, cancelling and deleting stored responses and counting input tokens bill nothing;
    # compaction runs the model and the WebSocket mode (connect) is not priced.
    _free = frozenset({"retrieve", "cancel", "delete", "input_items", "input_tokens"})
    _refused = _RAW | {"compact", "connect"}

    def create(self, **kwargs: Any) -> Any:
        call = _responses_call(self._options, kwargs)
        return _guarded(self, self._target.create, call, kwargs, _RESPONSES)

    def parse(self, **kwargs: Any) -> Any:
        """``parse`` with ``text_format`` a type: guarded as ``create``."""
        call = _responses_call(self._options, kwargs)
        return _guarded(self, self._target.parse, call, kwargs, _RESPONSES)

    def stream(self, **kwargs: Any) -> Any:
        """The SDK's ``stream()`` helper: a new response is this guarded ``create(stream=True)``;
        resuming a stored one (``response_id``) is the free ``retrieve``."""
        helper = responses_module.async_stream if self.is_async else responses_module.stream
        return helper(cast(Any, self), **kwargs)


class _Embeddings(_Proxy):
    def create(self, **kwargs: Any) -> Any:
        """Held at the input's tokens (counted offline; token arrays by their length) and one
        output token, charged the input the answer reports at the model's input rate."""
        call = _embeddings_call(self._options, kwargs)
        return _guarded(self, self._target.create, call, kwargs, _EMBEDDINGS)


class GuardedOpenAI(_Proxy):
    """An ``OpenAI`` / ``AsyncOpenAI`` client whose priced calls go through the guard."""

    _children = {"chat": _Chat, "responses": _Responses, "embeddings": _Embeddings}
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
    "embeddings": (embeddings_resources.Embeddings, embeddings_resources.AsyncEmbeddings),
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


# Service tiers billed at the standard rates. "flex" and "priority" are held and charged at their
# own rates (the price's ``service_tiers``, else the operator's multiplier table); "auto" (the
# project's default) is checked against the tier the answer reports.
_STANDARD_TIERS = frozenset({"auto", "default"})
_AUDIO = (
    "Audio tokens are billed at audio rates the price table does not have: reserve yourself "
    "around the unguarded client (budgets.reserve with the audio's cost as input)."
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
            "web_search_options",
            # Rejected prediction tokens are billed as output, within the ceiling sent.
            "prediction",
            "extra_body",
        }
    ),
    neutral=NEUTRAL_PARAMETERS,
    refused={
        "audio": _AUDIO,
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
            # Stored context the request does not show: held at the model's context window.
            "previous_response_id",
            "conversation",
            "prompt",
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
        "image": "Image input cannot be counted offline.",
        "context_management": "Server-side compaction runs the model again, unpriced.",
        "access_programs": "Not classified: the guard does not know what it costs.",
        "moderation": "Not classified: the guard does not know what it costs.",
        "prompt_cache_options": "Not classified: the guard does not know what it costs.",
        "parse_as": "Not classified: the guard does not know what it costs.",
    },
)
EMBEDDINGS_PARAMETERS = Parameters(
    priced=frozenset({"model", "input", "extra_body"}),
    neutral=frozenset({"dimensions", "encoding_format", "user", "extra_headers", "extra_query"})
    | {"timeout"},
    refused={},
)
# Models that answer with what they show: every other OpenAI model is taken to reason unseen
# (o-series, gpt-5 and later, deployments with names of their own).
_NON_REASONING = ("gpt-4o", "gpt-4.1", "gpt-4-", "gpt-3.5", "chatgpt-4o")
# Fields the SDK needs as its own arguments (it reads them to parse the answer): in extra_body
# they would reach the provider while the SDK parsed the answer as something else.
_NOT_IN_EXTRA_BODY = frozenset({"stream"})
# call.state: what the request leaves to the model's own limits, read before the hold.
_LEFT_TO_MODEL = "left_to_model"


def _may_reason(model: str, kwargs: dict[str, Any]) -> bool:
    """Whether ``model`` may bill reasoning tokens it never streams: asked for (a
    ``reasoning_effort`` or ``reasoning``), or not a model known to answer without them."""
    if given(kwargs.get("reasoning_effort")) or given(kwargs.get("reasoning")):
        return True
    name = model.rsplit("/", 1)[-1]
    return not (name == "gpt-4" or name.startswith(_NON_REASONING))


def _body(kwargs: dict[str, Any], parameters: Parameters, *, where: str) -> dict[str, Any]:
    """The request as the provider receives it (``extra_body`` merged, each key checked as the
    same parameter would be): unknown and refused keys raise before anything is sent."""
    body = with_extra_body(kwargs)
    parameters.check(body, where=where)
    extra = kwargs.get("extra_body")
    if isinstance(extra, dict):
        for name in sorted(_NOT_IN_EXTRA_BODY & set(extra)):
            raise InvalidUsage(
                f"extra_body sets {name}: pass it as the method's own argument (the SDK reads "
                "it to parse the answer).",
                field="extra_body",
            )
    return body


def _service_tier(options: GuardOptions, body: dict[str, Any]) -> str:
    """The tier to hold at (``""``: standard): the one asked for; for none or ``"auto"``, the
    project's default (``guard(project_tier=...)``). Audio output refused."""
    modalities = body.get("modalities")
    if isinstance(modalities, list | tuple) and "audio" in modalities:
        raise NotGuarded("openai modalities=['audio']", instead=_AUDIO)
    tier = body.get("service_tier")
    if not given(tier) or tier == "auto":
        return getattr(options, "project_tier", "")
    return "" if tier == "default" else str(tier)


def _choices(body: dict[str, Any]) -> int:
    """``n``: each choice bills its own output (the input once), so n outputs are held."""
    n = body.get("n")
    if not given(n):
        return 1
    count = bound(n)
    if count is None:
        raise InvalidUsage(f"n must be a whole number, 1 or more, got {n!r}.", field="n")
    return count


def _pin(sent: dict[str, Any], kwargs: dict[str, Any], name: str, value: Any) -> None:
    """Set what was held where the caller put it: in ``extra_body`` if it came from there (the
    SDK merges it over the named parameters), else as the named parameter."""
    extra = kwargs.get("extra_body")
    if isinstance(extra, dict) and name in extra:
        sent["extra_body"] = {**sent.get("extra_body", extra), name: value}
    else:
        sent[name] = value


def _per_choice_ceiling(call: Call, choices: int) -> int:
    """The ceiling each of ``choices`` is sent: the held output shared between them."""
    ceiling = call.ceiling_sent // choices
    if ceiling < 1:
        raise InvalidUsage(
            f"n={choices} choices do not fit the {call.ceiling_sent} output tokens held: ask "
            "for fewer choices or a larger ceiling.",
            field="n",
        )
    return ceiling


def _ceiling_left_to_model(call: Call, model_ceiling: int | None) -> bool:
    """Whether the caller gave no ceiling and the guard held the model's own maximum
    (``model_ceiling``): then no ceiling is sent, unless degradation lowered the one held (a
    context window is no valid ``max_tokens`` for a model whose output maximum is lower)."""
    return model_ceiling is not None and call.ceiling_sent >= model_ceiling


# -- images ------------------------------------------------------------------------------------


def _image_tokens(part: dict[str, Any], *, model: str) -> int:
    """An image part at the most it can cost on ``model`` (OpenAI's published rule): its size
    read from a ``data:`` URL's header, a remote URL or file id held at any size's worst case
    (never fetched)."""
    if part.get("type") == "image_url":  # chat: {"image_url": {"url": ..., "detail": ...}}
        image = part.get("image_url")
        image = image if isinstance(image, dict) else {"url": image}
        url, detail = image.get("url"), image.get("detail")
    else:  # responses: {"type": "input_image", "image_url": ..., "detail": ...}
        url, detail = part.get("image_url"), part.get("detail")
    return openai_image_tokens(model=model, detail=detail, size=data_url_size(url))


_IMAGE_PARTS = frozenset({"image_url", "input_image"})


def _without_images(content: object, *, model: str) -> tuple[object, int]:
    """A message's content without its image parts, and their tokens."""
    if not isinstance(content, list | tuple):
        return content, 0
    kept, tokens = [], 0
    for part in content:
        if isinstance(part, dict) and part.get("type") in _IMAGE_PARTS:
            tokens += _image_tokens(part, model=model)
        else:
            kept.append(part)
    return kept, tokens


# -- the model's own limits --------------------------------------------------------------------


def _bound_by_model(call: Call) -> int | None:
    """``_bounded``, failing closed as admission does (``LedgerUnavailable``) when the ledger
    cannot be read."""
    with ledger_guard("reading the model's limits"):
        return _bounded(call)


def _bounded(call: Call) -> int | None:
    """What the request leaves to the model, bounded by the model's price version before the
    hold: stored context (a previous response, a conversation, a stored prompt) at its context
    window, an omitted ceiling at its maximum output (unless the tenant's plan sets a default,
    which admission applies). Refused, saying what to set, when the price does not know. Returns
    the model's maximum when it was held as the ceiling."""
    left = call.state.pop(_LEFT_TO_MODEL, set())
    model_ceiling = None
    if call.ceiling is None and "ceiling" in left and _plan_default(call) is None:
        try:
            price = _model_price(call)
        except UnknownPrice:  # the plan's unknown-model policy decides, in admission
            price = None
        most = price and (price.max_output_tokens or price.context_window)
        # Without a known maximum the ceiling stays missing: admission refuses it
        # (OutputCeilingRequired), or applies a plan default set since.
        if most:
            call.ceiling = model_ceiling = most * call.state.get("choices", 1)
    if "input" in left:
        recorded = _recorded_chain(call)
        if recorded is not None:
            call.extra_input_tokens += recorded
            return model_ceiling
        window = _model_price(call).context_window
        if not window:
            raise InvalidUsage(
                f"{call.state.get('stored_context', 'stored context')} brings input the request "
                f"does not show: set the context_window of {call.model}'s price so the guard can "
                "hold it at the most the model can read, or send the whole input.",
                field=call.state.get("stored_context", "input"),
            )
        call.extra_input_tokens += window
    return model_ceiling


def _recorded_chain(call: Call) -> int | None:
    """The tokens the chain of the response the request continues billed, when this guard
    recorded it (``chains``) and nothing else stored is named."""
    previous = call.state.get("previous_response_id")
    if not isinstance(previous, str):
        return None
    return chain_tokens(
        tenant=call.options.tenant, provider=call.options.provider, response_id=previous
    )


def _record_chain(call: Call, response: object) -> None:
    """Remember what a stored response's chain billed, for a next turn that names it."""
    response_id, usage = _field(response, "id"), _response_usage(response)
    if isinstance(response_id, str) and usage is not None:
        chain_record(
            tenant=call.options.tenant,
            provider=call.options.provider,
            response_id=response_id,
            tokens=usage.input_tokens + usage.output_tokens,
        )


def _note_response(call: Call, answer: object) -> None:
    SDK.note(call, answer)
    _record_chain(call, answer)


def _observe_recorded_responses(call: Call, event: Any) -> bool | None:
    shown = _observe_responses(call, event)
    if getattr(event, "type", "") == "response.completed":
        _record_chain(call, getattr(event, "response", None))
    return shown


def _plan_default(call: Call) -> int | None:
    from llm_budgets.models import Tenant

    found = (
        Tenant.objects.filter(external_id=call.options.tenant)
        .values_list("plan__default_max_output_tokens", flat=True)
        .first()
    )
    return found


def _model_price(call: Call) -> Any:
    from llm_budgets.pricing.prices import price_in_effect

    return price_in_effect(provider=call.options.provider, model=call.model, at=timezone.now())


# -- chat completions --------------------------------------------------------------------------


def _chat_call(options: GuardOptions, kwargs: dict[str, Any]) -> tuple[Call, _Kind]:
    body = _body(kwargs, CHAT_PARAMETERS, where="openai chat.completions.create")
    model = _model(body)
    tier = _service_tier(options, body)
    choices = _choices(body)
    image_tokens = 0
    messages = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidUsage('each message needs a "role".', field="messages")
        content, images = _without_images(message.get("content"), model=model)
        image_tokens += images
        text = text_of(content, field_name="messages", text_types=_TEXT_PARTS)
        refuse_media(message.get("audio"), field_name="messages")
        if message.get("audio"):  # an earlier audio answer, referred to by id
            raise NotGuarded("openai messages with audio", instead=_AUDIO)
        if message.get("tool_calls"):
            text += json_text(message["tool_calls"])
        if message.get("name"):
            text = f"{message['name']}: {text}"
        messages.append(as_text_message(str(message["role"]), text))
    for name in ("tools", "functions", "response_format", "prediction"):
        if given(body.get(name)):
            messages.append(as_text_message("system", _schema_text(body[name])))
    # Chat web search: one search per request (its fee), its results billed as input.
    searched = given(body.get("web_search_options"))
    ceiling = body.get("max_completion_tokens")
    if not given(ceiling):
        ceiling = body.get("max_tokens")
    # n choices: n outputs held (a ceiling that is no count is admission's to refuse).
    per_choice = bound(ceiling)
    call = Call(
        options=options,
        model=model,
        ceiling=per_choice * choices if per_choice else (ceiling if given(ceiling) else None),
        messages=messages,
        sdk_errors=ERRORS,
        service_tier=tier,
        max_tool_calls={"web_search": 1} if searched else None,
        extra_input_tokens=image_tokens + (SEARCH_CONTENT_TOKENS_PER_USE if searched else 0),
    )
    call.state["choices"] = choices
    if not given(ceiling):
        call.state[_LEFT_TO_MODEL] = {"ceiling"}
    return call, _CHAT_SEARCHED if searched else _CHAT


def _chat_send(
    call: Call, kwargs: dict[str, Any], *, model_ceiling: int | None = None
) -> dict[str, Any]:
    body = with_extra_body(kwargs)
    sent = dict(kwargs)
    _pin(sent, kwargs, "model", call.model_sent)
    call.reasons = _may_reason(call.model_sent, body)
    ceiling = _per_choice_ceiling(call, _choices(body))
    # The held ceiling in the parameter the caller used (both, if both were given).
    if given(body.get("max_tokens")):
        _pin(sent, kwargs, "max_tokens", ceiling)
    if given(body.get("max_completion_tokens")) or not (
        given(body.get("max_tokens")) or _ceiling_left_to_model(call, model_ceiling)
    ):
        _pin(sent, kwargs, "max_completion_tokens", ceiling)
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


# An answer's ``service_tier`` as the modifier it was billed at: "default" is the standard
# rates; OpenAI's fast mode answers "priority" (billed at priority rates).
_ANSWERED_TIERS = {"default": "", "auto": "", "fast": "priority"}


def _note_tier(call: Call, answer: object) -> None:
    """The tier the answer was served (and billed) at: the commit charges at it, whatever was
    asked (a project whose default tier is priority answers "priority" to every call)."""
    tier = _field(answer, "service_tier")
    if isinstance(tier, str) and tier:
        call.billed_at(tier=_ANSWERED_TIERS.get(tier, tier))


# -- responses ---------------------------------------------------------------------------------


def _responses_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    body = _body(kwargs, RESPONSES_PARAMETERS, where="openai responses.create")
    model = _model(body)
    tier = _service_tier(options, body)
    image_tokens = 0
    messages = []
    if given(body.get("instructions")):
        messages.append(as_text_message("system", str(body["instructions"])))
    given_input = body.get("input")
    if isinstance(given_input, str):
        messages.append(as_text_message("user", given_input))
    elif isinstance(given_input, list | tuple):
        for item in given_input:
            if not isinstance(item, dict):
                raise InvalidUsage("each input item must be an object.", field="input")
            if "role" in item:
                content, images = _without_images(item.get("content"), model=model)
                image_tokens += images
                text = text_of(content, field_name="input", text_types=_TEXT_PARTS)
                messages.append(as_text_message(str(item["role"]), text))
            else:  # tool calls and their outputs, reasoning items: files and images refused
                refuse_media([item], field_name="input")
                messages.append(as_text_message("user", json_text(item)))
    stored = [name for name in _STORED_CONTEXT if given(body.get(name))]
    if not messages and not stored:
        raise InvalidUsage("input is required.", field="input")
    for name in ("tools", "text", "text_format", "prompt"):
        if given(body.get(name)):
            messages.append(as_text_message("system", _schema_text(body[name])))
    ceiling = body.get("max_output_tokens")
    tool_calls = _server_tools(body)
    call = Call(
        options=options,
        model=model,
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
        max_tool_calls=tool_calls,
        service_tier=tier,
        extra_input_tokens=image_tokens
        + sum(
            RESULT_TOKENS_PER_USE.get(name, 0) * calls for name, calls in (tool_calls or {}).items()
        ),
    )
    left = set()
    if not given(ceiling):
        left.add("ceiling")
    if stored:
        left.add("input")
        call.state["stored_context"] = stored[0]
        if stored == ["previous_response_id"]:
            call.state["previous_response_id"] = body["previous_response_id"]
    if left:
        call.state[_LEFT_TO_MODEL] = left
    return call


# Parameters that bring earlier input the request does not show (billed as input of this call).
_STORED_CONTEXT = ("previous_response_id", "conversation", "prompt")


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


def _responses_send(
    call: Call, kwargs: dict[str, Any], *, model_ceiling: int | None = None
) -> dict[str, Any]:
    body = with_extra_body(kwargs)
    sent = dict(kwargs)
    _pin(sent, kwargs, "model", call.model_sent)
    call.reasons = _may_reason(call.model_sent, body)
    if given(body.get("max_output_tokens")) or not _ceiling_left_to_model(call, model_ceiling):
        _pin(sent, kwargs, "max_output_tokens", call.ceiling_sent)
    return sent


# -- embeddings --------------------------------------------------------------------------------


def _embeddings_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    body = _body(kwargs, EMBEDDINGS_PARAMETERS, where="openai embeddings.create")
    given_input = body.get("input")
    items = [given_input] if isinstance(given_input, str) else given_input
    if not isinstance(items, list | tuple) or not items:
        raise InvalidUsage("input is required: text, or a list of texts or tokens.", field="input")
    texts: list[str] = []
    tokens = 0
    for item in items:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int):  # one array of token ids
            tokens += 1
        elif isinstance(item, list | tuple):  # a list of token-id arrays
            tokens += len(item)
        else:
            raise InvalidUsage("input must be text, or lists of token ids.", field="input")
    return Call(
        options=options,
        model=_model(body),
        ceiling=1,  # embeddings bill no output; the smallest ceiling admission takes
        messages=[as_text_message("user", text) for text in texts],
        sdk_errors=ERRORS,
        extra_input_tokens=tokens,
    )


def _embeddings_send(
    call: Call, kwargs: dict[str, Any], *, model_ceiling: int | None = None
) -> dict[str, Any]:
    sent = dict(kwargs)
    _pin(sent, kwargs, "model", call.model_sent)
    return sent


def _embeddings_usage(result: object) -> Usage | None:
    usage = _field(result, "usage")
    if usage is None:
        return None
    return usage_validate(input_tokens=_field(usage, "prompt_tokens") or 0, output_tokens=0)


def _searched_chat_usage(result: object) -> Usage | None:
    """A chat answer's usage plus its one web search (the fee Chat Completions bills per
    request with ``web_search_options``; the answer does not itemise it)."""
    return _with_search(_response_usage(result))


def _with_search(usage: Usage | None) -> Usage | None:
    if usage is None:
        return None
    return replace(usage, tool_calls={**usage.tool_calls, "web_search": 1})


def _observe_searched_chat(call: Call, chunk: Any) -> bool:
    shown = _observe_chat(call, chunk)
    if getattr(chunk, "usage", None) is not None:
        call.final_usage = _with_search(call.final_usage)
    return shown


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


# Output items that show the model reasoning unseen (billed as output whatever is shown).
_REASONING_ITEMS = frozenset({"reasoning"})
_SERVER_TOOL_ITEMS = {item: name for name, item in SERVER_TOOLS.items()}


def _observe_responses(call: Call, event: Any) -> bool:
    """Count an event: text deltas as output; an output item that starts a server tool call (its
    fee and results are billed even if the stream stops before they are reported) or shows
    reasoning (billed up to the ceiling); the final usage."""
    assert call.counter is not None
    kind = getattr(event, "type", "")
    if kind in _RESPONSE_TEXT_EVENTS:
        call.counter.add(getattr(event, "delta", None) or "")
        if kind.startswith("response.reasoning"):
            call.reasons = True
    elif kind == "response.output_item.added":
        item_type = _field(getattr(event, "item", None), "type")
        if item_type in _SERVER_TOOL_ITEMS:
            call.tool_started(_SERVER_TOOL_ITEMS[item_type])
        elif item_type in _REASONING_ITEMS:
            call.reasons = True
    elif kind in _RESPONSE_FINAL_EVENTS:
        response = getattr(event, "response", None)
        _note_tier(call, response)
        usage = _response_usage(response)
        if usage is not None:
            call.final_usage = usage
    return True


@dataclass(frozen=True)
class _Kind:
    """How one kind of request is sent: its SDK glue, its pin and its stream observer."""

    sdk: Sdk
    pin: Callable[..., dict[str, Any]]  # a Pin, with the model_ceiling the guard held
    observe: Observe


_CHAT = _Kind(SDK, _chat_send, _observe_chat)
_CHAT_SEARCHED = _Kind(replace(SDK, usage=_searched_chat_usage), _chat_send, _observe_searched_chat)
_RESPONSES = _Kind(replace(SDK, note=_note_response), _responses_send, _observe_recorded_responses)
_EMBEDDINGS = _Kind(replace(SDK, usage=_embeddings_usage), _embeddings_send, _observe_responses)


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
