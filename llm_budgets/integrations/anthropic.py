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
``parse``, beta, raw responses) raise ``NotGuarded``; everything else passes through.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import anthropic
from asgiref.sync import sync_to_async

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
    return GuardedAnthropic(client, options)


class _Proxy(ClientProxy):
    _sdk = "anthropic"
    _refused = frozenset(
        {
            "completions",
            "beta",
            "with_raw_response",
            "with_streaming_response",
            "messages.batches",
            "messages.parse",
            "messages.with_raw_response",
            "messages.with_streaming_response",
        }
    )
    _instead = _INSTEAD


class _Messages(_Proxy):
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

    def with_options(self, **kwargs: Any) -> GuardedAnthropic:
        return GuardedAnthropic(self._target.with_options(**kwargs), self._options)

    copy = with_options


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
        call = self._call
        call.admit()
        try:
            self._manager = self._method(**_send(call, self._kwargs))
            stream = self._manager.__enter__()
        except BaseException as exc:
            call.failed(exc)
            raise
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
        call = self._call
        await sync_to_async(call.admit)()
        try:
            self._manager = self._method(**_send(call, self._kwargs))
            stream = await self._manager.__aenter__()
        except BaseException as exc:
            await sync_to_async(call.failed)(exc)
            raise
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


def _server_tools(tools: object) -> dict[str, int] | None:
    """The web search / web fetch calls a request may make: each tool's ``max_uses``, required
    (without it the fees are unbounded and the call is refused, before anything is sent)."""
    if not isinstance(tools, list | tuple):
        return None
    held: dict[str, int] = {}
    for tool in tools:
        kind = str(tool.get("type", "")) if isinstance(tool, dict) else ""
        name = next((n for n in ("web_search", "web_fetch") if kind.startswith(n)), None)
        if name is None:
            continue
        uses = tool.get("max_uses")
        if isinstance(uses, bool) or not isinstance(uses, int) or uses < 1:
            raise InvalidUsage(
                f"the {kind} tool needs max_uses: each use is charged a fee, and without a "
                "bound the worst case cannot be held.",
                field="tools",
            )
        held[name] = held.get(name, 0) + uses
    return held or None


def _messages_call(options: GuardOptions, kwargs: dict[str, Any]) -> Call:
    refuse_priced_extra_body(kwargs)
    model = kwargs.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidUsage("model is required.", field="model")
    messages = []
    system = kwargs.get("system")
    if given(system):
        messages.append(
            as_text_message("system", text_of(system, field_name="system", text_types=_TEXT_PARTS))
        )
    for message in kwargs.get("messages") or []:
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidUsage('each message needs a "role".', field="messages")
        text = text_of(message.get("content"), field_name="messages", text_types=_TEXT_PARTS)
        messages.append(as_text_message(str(message["role"]), text))
    if given(kwargs.get("tools")):
        messages.append(as_text_message("system", json_text(kwargs["tools"])))
    ceiling = kwargs.get("max_tokens")
    return Call(
        options=options,
        model=model,
        ceiling=ceiling if given(ceiling) else None,
        messages=messages,
        sdk_errors=ERRORS,
        max_tool_calls=_server_tools(kwargs.get("tools")),
    )


def _send(call: Call, kwargs: dict[str, Any]) -> dict[str, Any]:
    sent = dict(kwargs)
    sent["model"] = call.model_sent
    sent["max_tokens"] = call.ceiling_sent
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
