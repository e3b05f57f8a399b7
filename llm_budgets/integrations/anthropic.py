"""A one-line guard for the official ``anthropic`` SDK (``pip install llm-budgets[anthropic]``).

.. code-block:: python

    from llm_budgets.integrations.anthropic import guard

    client = guard(anthropic.Anthropic(), tenant="acme", end_user="u-1")
    client.messages.create(model="claude-3-5-haiku-latest", max_tokens=500, messages=[...])

``client.messages.create`` (plain and ``stream=True``), ``client.messages.stream()`` and
``client.messages.parse()``, and the same three of ``client.beta.messages``, on ``Anthropic`` and
``AsyncAnthropic``, are admitted, sent with the model and ``max_tokens`` that were held, and
settled from the usage Anthropic reports (``input_tokens`` plus cache reads and writes, with the
5-minute / 1-hour split, ``output_tokens``, server tool use), through
:func:`llm_budgets.usage.from_anthropic`. In a stream the usage comes from ``message_start``
(input) and ``message_delta`` (output). ``extra_body`` keys are checked and priced as the same
parameters. Calls that cost money but cannot be priced (batches, raw responses and raw HTTP,
middleware, the beta namespace's other resources) raise ``NotGuarded``; what bills nothing
(models, files, ``count_tokens``) passes through; anything unclassified is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import anthropic
from asgiref.sync import sync_to_async
from pydantic import TypeAdapter

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.anthropic_media import split_media
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
    retry_delay,
    text_of,
    with_extra_body,
)
from llm_budgets.integrations.headers import FREE_BETAS, check_call
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
from llm_budgets.integrations.transport import sending
from llm_budgets.usage import Usage, from_anthropic

__all__ = ["GuardedAnthropic", "guard"]

ERRORS = SdkErrors(
    status=anthropic.APIStatusError,
    timeout=anthropic.APITimeoutError,
    connection=anthropic.APIConnectionError,
)
_TEXT_PARTS = frozenset({"text"})
_INSTEAD = (
    "Reserve with budgets.reserve(...) and call the unguarded client inside the with-block, "
    "or use messages.create / messages.stream / messages.parse."
)


def guard(
    client: anthropic.Anthropic | anthropic.AsyncAnthropic,
    *,
    tenant: str,
    end_user: str | None = None,
    tags: dict[str, str] | None = None,
    allow_degrade: bool = False,
    provider: str = "anthropic",
    ttl: int | None = None,
    switch_check_seconds: float = SWITCH_CHECK_SECONDS,
) -> Any:
    """Wrap ``client`` so every priced call is admitted and settled against ``tenant``'s
    budgets (the arguments as in :func:`llm_budgets.integrations.openai.guard`)."""
    options = GuardOptions(
        tenant=tenant,
        end_user=end_user,
        tags=tags,
        allow_degrade=allow_degrade,
        provider=provider,
        ttl=ttl,
        switch_check_seconds=switch_check_seconds,
    )
    return GuardedAnthropic(*guarded_copy(client, options, {"max_retries": client.max_retries}))


_RAW = RAW_RESPONSES


class _Proxy(ClientProxy):
    _sdk = "anthropic"
    _refused = _RAW
    _instead = _INSTEAD


class _Messages(_Proxy):
    _free = frozenset({"count_tokens"})
    _refused = _RAW | {"batches"}
    _parameters: Parameters
    _where = "anthropic messages"

    def _call(self, method: str, kwargs: dict[str, Any]) -> Call:
        return _messages_call(
            self._options, kwargs, parameters=self._parameters, where=f"{self._where}.{method}"
        )

    def create(self, **kwargs: Any) -> Any:
        call = self._call("create", kwargs)
        if self.is_async:
            return asend(SDK, self._target.create, call, kwargs, _send, _observe)
        return send(SDK, self._target.create, call, kwargs, _send, _observe)

    def parse(self, **kwargs: Any) -> Any:
        """``parse`` sends one plain request (never a stream) and parses its answer."""
        call = self._call("parse", kwargs)
        if self.is_async:
            return asend(SDK, self._target.parse, call, kwargs, _send, _observe)
        return send(SDK, self._target.parse, call, kwargs, _send, _observe)

    def stream(self, **kwargs: Any) -> Any:
        call = self._call("stream", kwargs)
        if self.is_async:
            return AsyncGuardedStreamManager(self._target.stream, call, kwargs)
        return GuardedStreamManager(self._target.stream, call, kwargs)


class _BetaMessages(_Messages):
    # The tool runner and threads make calls of their own the guard does not see.
    _refused = _RAW | {"batches", "tool_runner", "thread"}
    _where = "anthropic beta.messages"


class _Beta(_Proxy):
    """``client.beta``: its messages are guarded like ``client.messages``; models and files
    bill nothing; its other resources (agents, sessions, skills...) are refused."""

    _children = {"messages": _BetaMessages}
    _free = frozenset({"models", "files"})
    # Agents, sessions and the like run (and bill) calls the guard never sees.
    _refused = _RAW | {
        "agents",
        "compliance",
        "deployment_runs",
        "deployments",
        "dreams",
        "environments",
        "memory_stores",
        "organization",
        "sessions",
        "skills",
        "tunnels",
        "user_profiles",
        "vaults",
        "webhooks",
    }


class GuardedAnthropic(_Proxy):
    """An ``Anthropic`` / ``AsyncAnthropic`` client whose priced calls go through the guard."""

    _children = {"messages": _Messages, "beta": _Beta}
    # Client configuration, model lists and file uploads bill nothing.
    _free = CLIENT_CONFIG | {
        "auth_token",
        "credentials",
        "webhook_key",
        "open_telemetry",
        "middleware",
        "models",
        "files",
    }
    # Middleware sees and may send requests the guard does not; raw HTTP likewise.
    _refused = RAW_HTTP | {
        "completions",
        "skills",
        "user_profiles",
        "organization",
        "with_middleware",
    }

    def with_options(self, **kwargs: Any) -> GuardedAnthropic:
        return GuardedAnthropic(*guarded_copy(self._target, self._options, kwargs))

    copy = with_options


SDK_CLASSES: dict[str, tuple[type, ...]] = {
    "": (anthropic.Anthropic, anthropic.AsyncAnthropic),
    "messages": (anthropic.resources.Messages, anthropic.resources.AsyncMessages),
    "beta": (anthropic.resources.beta.Beta, anthropic.resources.beta.AsyncBeta),
    "beta.messages": (
        anthropic.resources.beta.messages.Messages,
        anthropic.resources.beta.messages.AsyncMessages,
    ),
}


class GuardedStream(SyncStreamGuard, anthropic.Stream):
    """An ``anthropic.Stream`` whose events pass through the guard's accounting."""


class AsyncGuardedStream(AsyncStreamGuard, anthropic.AsyncStream):
    """An ``anthropic.AsyncStream`` whose events pass through the guard's accounting."""


SDK = Sdk(
    stream=anthropic.Stream,
    async_stream=anthropic.AsyncStream,
    guarded_stream=GuardedStream,
    async_guarded_stream=AsyncGuardedStream,
    usage=lambda message: _usage(getattr(message, "usage", None)),
    note=lambda call, message: _note_tier(call, getattr(message, "usage", None)),
)


class _StreamManager:
    def __init__(self, method: Any, call: Call, kwargs: dict[str, Any]) -> None:
        self._method = method
        self._call = call
        self._kwargs = kwargs
        self._manager: Any = None

    @property
    def hold(self) -> Any:
        """The reservation's ``Hold`` (once entered)."""
        return self._call.hold


class GuardedStreamManager(_StreamManager):
    """What ``messages.stream(...)`` returns: admits on ``__enter__`` (when the request is sent),
    gives the SDK's ``MessageStream`` reading a guarded raw stream, settles on ``__exit__``."""

    def __enter__(self) -> Any:
        check_call(self._method, self._kwargs, self._call)
        attempt = 0
        while True:
            call = self._call
            call.admit()
            try:
                self._manager = self._method(**_send(call, self._kwargs))
                with sending(call):
                    stream = self._manager.__enter__()
            except BaseException as exc:
                call.failed(exc)
                delay = retry_delay(exc, attempt=attempt, call=call)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt, self._call = attempt + 1, call.fresh()
                continue
            call.streamed = True
            # MessageStream reads ``_raw_stream`` lazily, on its first event.
            stream._raw_stream = GuardedStream(stream._raw_stream, call=call, observe=_observe)
            return stream

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._manager is not None:
            self._manager.__exit__(exc_type, exc, exc_tb)


class AsyncGuardedStreamManager(_StreamManager):
    """The ``AsyncAnthropic`` form of :class:`GuardedStreamManager` (``async with``)."""

    async def __aenter__(self) -> Any:
        check_call(self._method, self._kwargs, self._call)
        attempt = 0
        while True:
            call = self._call
            await call.aadmit()
            try:
                self._manager = self._method(**_send(call, self._kwargs))
                with sending(call):
                    stream = await self._manager.__aenter__()
            except BaseException as exc:
                await sync_to_async(call.failed)(exc)
                delay = retry_delay(exc, attempt=attempt, call=call)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt, self._call = attempt + 1, call.fresh()
                continue
            call.streamed = True
            stream._raw_stream = AsyncGuardedStream(stream._raw_stream, call=call, observe=_observe)
            return stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._manager is not None:
            await self._manager.__aexit__(exc_type, exc, exc_tb)


def _usage(usage: object) -> Usage | None:
    return None if usage is None else from_anthropic(usage)


def _note_tier(call: Call, usage: object) -> None:
    """What the answer's usage says it was billed at: the commit charges at it (Priority Tier
    capacity used under ``service_tier="auto"``, fast mode, US-only inference), the hold's
    modifiers for what it does not say."""
    found = _as_dict(usage)
    tier, speed, geo = found.get("service_tier"), found.get("speed"), found.get("inference_geo")
    call.billed_at(
        tier=_ANSWERED_TIERS.get(tier, tier) if isinstance(tier, str) else None,
        speed=("" if speed == "standard" else speed) if isinstance(speed, str) else None,
        geo=("" if geo in _GLOBAL_GEOS else f"geo_{geo}") if isinstance(geo, str) else None,
    )


# Tiers billed at most the standard rates; any other is a modifier of its own.
_ANSWERED_TIERS = {"standard": "", "batch": ""}
_GLOBAL_GEOS = frozenset({"", "global"})


# Anthropic's tool-use system prompt, added to the input of any call with tools: tokens for
# tool_choice auto/none and any/tool, per model (its published table); newer models 346 / 313.
TOOL_PROMPT_TOKENS = {
    "claude-3-opus": (530, 281),
    "claude-3-sonnet": (159, 235),
    "claude-3-haiku": (264, 340),
}
TOOL_PROMPT_TOKENS_DEFAULT = (346, 313)


def tool_prompt_tokens(model: str, tool_choice: object) -> int:
    auto, forced = next(
        (row for prefix, row in TOOL_PROMPT_TOKENS.items() if model.startswith(prefix)),
        TOOL_PROMPT_TOKENS_DEFAULT,
    )
    kind = tool_choice.get("type") if isinstance(tool_choice, dict) else None
    return forced if kind in {"any", "tool"} else auto


# Web search results are billed as input of the call; Anthropic publishes no bound. Held per
# allowed search at the guard's bound (guarding.SEARCH_CONTENT_TOKENS_PER_USE).
WEB_SEARCH_CONTENT_TOKENS_PER_USE = SEARCH_CONTENT_TOKENS_PER_USE


def _server_tools(tools: object) -> tuple[dict[str, int] | None, int]:
    """The web search / web fetch calls a request may make (each tool's ``max_uses``,
    required: without it the fees are unbounded and the call is refused, before anything is
    sent), and the search content they may bring as input. Other server tools are refused."""
    if not isinstance(tools, list | tuple):
        return None, 0
    held: dict[str, int] = {}
    content = 0
    for tool in tools:
        kind = str(tool.get("type", "") or "custom") if isinstance(tool, dict) else "custom"
        if kind == "custom":
            continue
        name = next((n for n in ("web_search", "web_fetch") if kind.startswith(n)), None)
        if name is None:
            raise NotGuarded(
                f"anthropic tool {kind!r}",
                instead="Only your own tools and web_search / web_fetch (with max_uses) are "
                "priced: Anthropic-defined tools add system prompt tokens, and code execution "
                "bills container time the guard cannot bound. " + _INSTEAD,
            )
        uses = bound(tool.get("max_uses"))
        if uses is None:
            raise InvalidUsage(
                f"the {kind} tool needs max_uses: each use is charged a fee, and without a "
                "bound the worst case cannot be held.",
                field="tools",
            )
        per_use = (
            bound(tool.get("max_content_tokens"))
            if name == "web_fetch"
            else WEB_SEARCH_CONTENT_TOKENS_PER_USE
        )
        if per_use is None:
            raise InvalidUsage(
                f"the {kind} tool needs max_content_tokens: fetched content is billed as "
                "input, and without a bound it cannot be held.",
                field="tools",
            )
        held[name] = held.get(name, 0) + uses
        content += uses * per_use
    return held or None, content


MESSAGES_PARAMETERS = Parameters(
    priced=frozenset(
        {
            "model",
            "messages",
            "max_tokens",
            "system",
            "tools",
            "tool_choice",
            "thinking",
            "stream",
            "service_tier",
            "speed",
            "inference_geo",
            "output_format",
            "output_config",
            "extra_body",
        }
    ),
    neutral=NEUTRAL_PARAMETERS | {"cache_control", "user_profile_id", "workspace_id"},
    refused={
        "container": "Code execution containers are billed by time the guard does not price.",
        "diagnostics": "Not classified: the guard does not know what it costs.",
    },
)
_Messages._parameters = MESSAGES_PARAMETERS

# ``betas`` (the anthropic-beta header) that change nothing the guard does not already price:
# fast mode is priced by ``speed``, PDFs by their pages, server tools by their uses, output by
# the ceiling held, cache writes at the dearest input rate; context management only clears
# (checked below). Any other beta may change the price: refused until classified. (The same
# list as the header check's free betas, plus the ones these parameters need.)
# The betas a call may ask for: those the header check lets through (one list for both).
PRICED_BETAS = FREE_BETAS
BETA_MESSAGES_PARAMETERS = Parameters(
    priced=MESSAGES_PARAMETERS.priced | {"betas", "context_management"},
    neutral=MESSAGES_PARAMETERS.neutral,
    refused={
        **MESSAGES_PARAMETERS.refused,
        "billing_policy": "Not classified: the guard does not know what it costs.",
        "compaction": "Compaction samples a summary the request does not bound.",
        "fallbacks": "A fallback model would serve the call at a price that was not held.",
        "fallback_credit_token": "A fallback model would serve the call at a price that was "
        "not held.",
        "mcp_servers": "MCP tool results come back as input the guard cannot bound.",
        "thread": "Not classified: the guard does not know what it costs.",
    },
)
_BetaMessages._parameters = BETA_MESSAGES_PARAMETERS


def _check_betas(body: Mapping[str, Any], where: str) -> None:
    """Each beta asked for is one that changes nothing unpriced; context management only
    clears (a compacting edit samples a summary, billed as output the request does not bound)."""
    betas = body.get("betas")
    for beta in betas if given(betas) and isinstance(betas, list | tuple) else []:
        if beta not in PRICED_BETAS:
            raise NotGuarded(
                f"{where}(betas=[{beta!r}])",
                instead="This beta may change what the call costs and the guard does not "
                "classify it. " + _INSTEAD,
            )
    edits = body.get("context_management")
    edits = edits.get("edits") if isinstance(edits, Mapping) else None
    for edit in edits if isinstance(edits, list | tuple) else []:
        kind = str(edit.get("type", "")) if isinstance(edit, Mapping) else ""
        if not kind.startswith("clear_"):
            raise NotGuarded(
                f"{where}(context_management={{'edits': [{kind!r}]}})",
                instead="Only edits that clear (clear_tool_uses, clear_thinking) are priced.",
            )


# Billing modifiers, in the fixed order they are joined with "+" (``Call.service_tier``):
# fast mode (6x on the models that offer it) and US-only inference (1.1x).
_SPEEDS = {"standard": "", "fast": "fast"}
_GEOS = {"global": "", "us": "geo_us"}


def _service_tier(kwargs: Mapping[str, Any]) -> str:
    """The billing modifiers the call is held and charged at (``"fast"``, ``"geo_us"``,
    ``"fast+geo_us"``; ``""``: standard), priced from the price's ``service_tiers`` or the
    modifier's multiplier (``UnknownPrice`` without either: never at standard)."""
    parts = []
    for name, known in (("speed", _SPEEDS), ("inference_geo", _GEOS)):
        value = kwargs.get(name)
        if not given(value):
            continue
        if value not in known:
            raise NotGuarded(
                f"anthropic {name}={value!r}",
                instead=f"Only {name} {' / '.join(map(repr, known))} are priced.",
            )
        if known[value]:
            parts.append(known[value])
    return "+".join(parts)


def _thinks(kwargs: Mapping[str, Any]) -> bool:
    thinking = kwargs.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") not in {None, "disabled"}


def _schema_text(value: object) -> str:
    """``output_format`` as the JSON schema sent: ``parse()`` / ``stream()`` take a type and
    send its schema; a dict is sent as it is."""
    if isinstance(value, type):
        return json_text(TypeAdapter(value).json_schema())
    return json_text(value)


def _messages_call(
    options: GuardOptions,
    kwargs: dict[str, Any],
    *,
    parameters: Parameters = MESSAGES_PARAMETERS,
    where: str = "anthropic messages.create",
) -> Call:
    # The body as Anthropic receives it: extra_body's keys are checked and priced as the same
    # parameters (one the guard does not know is refused, nothing sent).
    body = with_extra_body(kwargs)
    if isinstance(kwargs.get("extra_body"), Mapping) and "stream" in kwargs["extra_body"]:
        # The SDK reads the answer as it was asked by its own argument, not by the body.
        raise InvalidUsage(
            "stream in extra_body: pass stream=True as the method's own argument (or use "
            "messages.stream()).",
            field="extra_body",
        )
    parameters.check(body, where=where)
    _check_betas(body, where)
    tier = _service_tier(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidUsage("model is required.", field="model")
    messages = []
    system = body.get("system")
    if given(system):
        messages.append(
            as_text_message("system", text_of(system, field_name="system", text_types=_TEXT_PARTS))
        )
    extra = 0
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidUsage('each message needs a "role".', field="messages")
        content, media_tokens = split_media(message.get("content"))
        extra += media_tokens
        text = text_of(content, field_name="messages", text_types=_TEXT_PARTS)
        messages.append(as_text_message(str(message["role"]), text))
    if given(body.get("tools")):
        messages.append(as_text_message("system", json_text(body["tools"])))
        extra += tool_prompt_tokens(model, body.get("tool_choice"))
    for name in ("output_format", "output_config"):
        if given(body.get(name)):
            messages.append(as_text_message("system", _schema_text(body[name])))
    tool_calls, search_content = _server_tools(body.get("tools"))
    ceiling = body.get("max_tokens")
    return Call(
        options=options,
        model=model,
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
        max_tool_calls=tool_calls,
        extra_input_tokens=extra + search_content,
        service_tier=tier,
    )


# Anthropic's smallest thinking budget.
MIN_THINKING_BUDGET = 1024


def _send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments sent: the model and ceiling held (and a thinking budget below it), each
    pinned where the caller put it (a named argument or ``extra_body``)."""
    sent = dict(kwargs)
    extra = dict(kwargs["extra_body"]) if isinstance(kwargs.get("extra_body"), Mapping) else None

    def pin(name: str, value: object) -> None:
        if extra is not None and name in extra:
            extra[name] = value
        else:
            sent[name] = value

    pin("model", call.model_sent)
    pin("max_tokens", call.ceiling_sent)
    body = with_extra_body(kwargs)
    call.reasons = _thinks(body)
    thinking = body.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if isinstance(thinking, dict) and isinstance(budget, int) and budget >= call.ceiling_sent:
        # The ceiling held is below the one asked for (clamped or degraded): the thinking
        # budget must stay below it, as Anthropic requires.
        if call.ceiling_sent - 1 < MIN_THINKING_BUDGET:
            raise InvalidUsage(
                f"thinking.budget_tokens must stay below max_tokens, and the ceiling held is "
                f"{call.ceiling_sent}: too small for the smallest thinking budget "
                f"({MIN_THINKING_BUDGET}). Ask for less thinking or a larger limit.",
                field="thinking",
            )
        pin("thinking", {**thinking, "budget_tokens": call.ceiling_sent - 1})
    if extra is not None:
        sent["extra_body"] = extra
    return sent


def _as_dict(usage: object) -> dict[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, dict):
        return dict(usage)
    dump = getattr(usage, "model_dump", None)
    return dict(dump()) if dump is not None else dict(vars(usage))


def _observe(call: Call, event: Any) -> None:
    """Anthropic's stream: ``message_start`` carries the input usage, ``content_block_delta`` the
    output as it comes, ``message_delta`` the cumulative usage (output, and input fields when the
    API repeats them)."""
    assert call.counter is not None
    kind = getattr(event, "type", "")
    if kind == "message_start":
        start = _as_dict(getattr(getattr(event, "message", None), "usage", None))
        call.state["usage"] = start
        call.partial_usage = from_anthropic(start)
        _note_tier(call, start)
    elif kind == "content_block_start":
        _block_started(call, getattr(event, "content_block", None))
    elif kind == "content_block_delta":
        delta = getattr(event, "delta", None)
        for name in ("text", "partial_json", "thinking"):
            call.counter.add(getattr(delta, name, None) or "")
    elif kind == "message_delta":
        merged = dict(call.state.get("usage", {}))
        merged.update(
            {k: v for k, v in _as_dict(getattr(event, "usage", None)).items() if v is not None}
        )
        call.state["usage"] = merged
        call.final_usage = from_anthropic(merged)
        _note_tier(call, merged)


# Content blocks that show Claude thinking: what it bills is more than the summary shown.
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _block_started(call: Call, block: object) -> None:
    """A content block's start: a server tool call (``server_tool_use``, e.g. a web search) is
    billed its fee and results, which ``message_delta`` reports only at the end; a thinking
    block means the output billed may reach the ceiling whatever the summary shows."""
    kind = getattr(block, "type", None)
    if kind == "server_tool_use":
        call.tool_started(str(getattr(block, "name", "") or "server_tool"))
    elif kind in _THINKING_BLOCKS:
        call.reasons = True


# Checked against the installed SDK at import (see llm_budgets.integrations.openai).
UNCLASSIFIED = unclassified(GuardedAnthropic, SDK_CLASSES)
UNCLASSIFIED_PARAMETERS = {
    where: missing
    for where, parameters, method in (
        ("messages.create", MESSAGES_PARAMETERS, anthropic.resources.Messages.create),
        ("messages.stream", MESSAGES_PARAMETERS, anthropic.resources.Messages.stream),
        ("messages.parse", MESSAGES_PARAMETERS, anthropic.resources.Messages.parse),
        (
            "beta.messages.create",
            BETA_MESSAGES_PARAMETERS,
            anthropic.resources.beta.messages.Messages.create,
        ),
        (
            "beta.messages.stream",
            BETA_MESSAGES_PARAMETERS,
            anthropic.resources.beta.messages.Messages.stream,
        ),
        (
            "beta.messages.parse",
            BETA_MESSAGES_PARAMETERS,
            anthropic.resources.beta.messages.Messages.parse,
        ),
    )
    if (missing := parameters.unclassified(method))
}
if UNCLASSIFIED or UNCLASSIFIED_PARAMETERS:
    logging.getLogger("llm_budgets").warning(
        "llm_budgets: anthropic %s has attributes %s and parameters %s the guard does not "
        "classify; they are refused (NotGuarded).",
        anthropic.__version__,
        UNCLASSIFIED,
        UNCLASSIFIED_PARAMETERS,
    )
