"""A one-line guard for the official ``anthropic`` SDK (``pip install llm-budgets[anthropic]``).

.. code-block:: python

    from llm_budgets.integrations.anthropic import guard

    client = guard(anthropic.Anthropic(), tenant="acme", end_user="u-1")
    client.messages.create(model="claude-3-5-haiku-latest", max_tokens=500, messages=[...])

``client.messages.create`` (plain and ``stream=True``) and ``client.messages.stream()``, on
``Anthropic`` and ``AsyncAnthropic``, are admitted, sent with the model and ``max_tokens`` that
were held, and settled from the usage Anthropic reports (``input_tokens`` plus cache reads and
writes, with the 5-minute / 1-hour split, ``output_tokens``, server tool use), through
:func:`llm_budgets.usage.from_anthropic`. In a stream the usage comes from ``message_start``
(input) and ``message_delta`` (output). Calls that cost money but cannot be priced (batches,
``parse``, beta, raw responses and raw HTTP, middleware) raise ``NotGuarded``; what bills nothing
(models, files, ``count_tokens``) passes through; anything unclassified is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Any

import anthropic
from asgiref.sync import sync_to_async

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
    refuse_priced_extra_body,
    retry_delay,
    text_of,
)
from llm_budgets.integrations.headers import check_call
from llm_budgets.integrations.images import anthropic_image_tokens
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
    "or use messages.create / messages.stream."
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
    _refused = _RAW | {"batches", "parse"}

    def create(self, **kwargs: Any) -> Any:
        call = _messages_call(self._options, kwargs)
        if self.is_async:
            return asend(SDK, self._target.create, call, kwargs, _send, _observe)
        return send(SDK, self._target.create, call, kwargs, _send, _observe)

    def stream(self, **kwargs: Any) -> Any:
        call = _messages_call(self._options, kwargs)
        if self.is_async:
            return AsyncGuardedStreamManager(self._target.stream, call, kwargs)
        return GuardedStreamManager(self._target.stream, call, kwargs)


class GuardedAnthropic(_Proxy):
    """An ``Anthropic`` / ``AsyncAnthropic`` client whose priced calls go through the guard."""

    _children = {"messages": _Messages}
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
        "beta",
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
    """Priority Tier capacity used under ``service_tier="auto"`` is not what was held."""
    call.answered_at_tier(_as_dict(usage).get("service_tier"), standard=_STANDARD_TIERS)


_STANDARD_TIERS = frozenset({"standard", "batch"})


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
                "priced: Anthropic-defined tools add system prompt tokens and code execution "
                "bills container time.",
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
            else SEARCH_CONTENT_TOKENS_PER_USE
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


def _service_tier(kwargs: dict[str, Any]) -> str:
    """Fast mode is held and charged at the price's ``"fast"`` rates (refused without them);
    regional inference (billed above the standard rates) is refused."""
    geo = kwargs.get("inference_geo")
    if given(geo) and geo != "global":
        raise NotGuarded(
            f"anthropic inference_geo={geo!r}",
            instead="Regional inference is billed above the price table's rates.",
        )
    speed = kwargs.get("speed")
    return str(speed) if given(speed) and speed != "standard" else ""


def _thinks(kwargs: dict[str, Any]) -> bool:
    thinking = kwargs.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") not in {None, "disabled"}


def _messages_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    MESSAGES_PARAMETERS.check(kwargs, where="anthropic messages.create")
    refuse_priced_extra_body(kwargs)
    tier = _service_tier(kwargs)
    model = kwargs.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidUsage("model is required.", field="model")
    messages = []
    system = kwargs.get("system")
    if given(system):
        messages.append(
            as_text_message("system", text_of(system, field_name="system", text_types=_TEXT_PARTS))
        )
    extra = 0
    for message in kwargs.get("messages") or []:
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidUsage('each message needs a "role".', field="messages")
        content, image_tokens = _without_inline_images(message.get("content"))
        extra += image_tokens
        text = text_of(content, field_name="messages", text_types=_TEXT_PARTS)
        messages.append(as_text_message(str(message["role"]), text))
    if given(kwargs.get("tools")):
        messages.append(as_text_message("system", json_text(kwargs["tools"])))
        extra += tool_prompt_tokens(model, kwargs.get("tool_choice"))
    for name in ("output_format", "output_config"):
        if given(kwargs.get(name)):
            messages.append(as_text_message("system", json_text(kwargs[name])))
    tool_calls, search_content = _server_tools(kwargs.get("tools"))
    ceiling = kwargs.get("max_tokens")
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


def _without_inline_images(content: object) -> tuple[object, int]:
    """``content`` without the images sent inline (a tool result's too), and their tokens by
    Anthropic's published rule; images by URL or file stay, and are refused when counted."""
    if not isinstance(content, list | tuple):
        return content, 0
    kept: list[object] = []
    tokens = 0
    for block in content:
        if isinstance(block, dict) and block.get("type") == "image":
            counted = anthropic_image_tokens(block)
            if counted is not None:
                tokens += counted
                continue
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            inner, inner_tokens = _without_inline_images(block.get("content"))
            block = {**block, "content": inner}
            tokens += inner_tokens
        kept.append(block)
    return kept, tokens


# Anthropic's smallest thinking budget.
MIN_THINKING_BUDGET = 1024


def _send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    sent["max_tokens"] = call.ceiling_sent
    call.reasons = _thinks(kwargs)
    thinking = kwargs.get("thinking")
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
        sent["thinking"] = {**thinking, "budget_tokens": call.ceiling_sent - 1}
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


# Checked against the installed SDK at import (see llm_budgets.integrations.openai).
UNCLASSIFIED = unclassified(GuardedAnthropic, SDK_CLASSES)
UNCLASSIFIED_PARAMETERS = {
    where: missing
    for where, method in (
        ("messages.create", anthropic.resources.Messages.create),
        ("messages.stream", anthropic.resources.Messages.stream),
    )
    if (missing := MESSAGES_PARAMETERS.unclassified(method))
}
if UNCLASSIFIED or UNCLASSIFIED_PARAMETERS:
    logging.getLogger("llm_budgets").warning(
        "llm_budgets: anthropic %s has attributes %s and parameters %s the guard does not "
        "classify; they are refused (NotGuarded).",
        anthropic.__version__,
        UNCLASSIFIED,
        UNCLASSIFIED_PARAMETERS,
    )
