"""The guarded client's HTTP transport: the last door. Every request a guarded SDK client makes
(through the guard, a raw ``post``, ``with_raw_response``, a resource's ``_client``, a copy made
by ``with_options``...) goes through the httpx client the guard installed, whose transport
refuses a billable request unless the guard itself is sending it under a live hold.

The rule (:func:`billable`): a ``GET``, ``HEAD``, ``OPTIONS`` or ``DELETE`` bills nothing (lists,
retrievals, deletions); any other method is billable unless its path ends like one of
:data:`FREE_PATHS` (uploads, token counting, free moderation, stored conversations, metadata
updates, cancellations). The guard marks its own request with :func:`sending`, a context
variable (per thread and per asyncio task) holding the call whose hold is live.

The transport the client had is kept in a table of this module, not on an attribute, so that
nothing reachable from the guarded client by attribute sends around this one.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import re
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx2

from llm_budgets.integrations.guarding import NotGuarded

if TYPE_CHECKING:
    from llm_budgets.integrations.guarding import Call

FREE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
# Ends of paths that bill nothing whatever the method (the prefix, e.g. "/v1" or a gateway's,
# does not matter). Files and uploads are stored, not run; counting tokens, moderations,
# conversations (stored items, billed when a response uses them, which the guard holds),
# stored completions' metadata and cancelling a response bill nothing.
FREE_PATHS = tuple(
    re.compile(pattern)
    for pattern in (
        r"/files(/[^/]+)?$",
        r"/uploads(/[^/]+(/(parts|complete|cancel))?)?$",
        r"/messages/count_tokens$",
        r"/responses/input_tokens$",
        r"/moderations$",
        r"/conversations(/[^/]+(/items(/[^/]+)?)?)?$",
        r"/chat/completions/[^/]+$",
        r"/responses/[^/]+/cancel$",
    )
)
_INSTEAD = (
    "Use the guarded client's own methods (they hold the call's worst case first), or, for a "
    "call the guard cannot price, reserve with budgets.reserve(...) and use client.unguarded "
    "inside the with-block."
)

# The call the guard is sending, while it sends it (None: nobody is).
_SENDING: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "llm_budgets_guard_sending", default=None
)
# A guard transport -> the transport it wraps and the httpx client that owned it (kept alive so
# its finaliser does not close the connection pool the guarded copy shares).
_WRAPPED: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def sending(call: Call) -> Iterator[None]:
    """Around the SDK call the guard makes once ``call`` holds its worst case: its requests
    pass the transport."""
    token = _SENDING.set(call)
    try:
        yield
    finally:
        _SENDING.reset(token)


def billable(method: str, path: str) -> bool:
    if method.upper() in FREE_METHODS:
        return False
    return not any(pattern.search(path) for pattern in FREE_PATHS)


def _admit(request: httpx2.Request) -> None:
    """``NotGuarded`` for a billable request the guard is not sending under a live hold."""
    if not billable(request.method, request.url.path):
        return
    call = _SENDING.get()
    if call is None or call.hold is None or call.settled:
        raise NotGuarded(
            f"{request.method} {request.url.path} sent around the guard (raw HTTP, a resource's "
            "_client, a copy of the SDK client)",
            instead=_INSTEAD,
        )


class GuardTransport(httpx2.BaseTransport):
    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        _admit(request)
        inner: httpx2.BaseTransport = _WRAPPED[self][0]
        return inner.handle_request(request)

    def close(self) -> None:
        """Nothing: the connections belong to the client that was guarded (its owner closes
        them); a guarded copy closing must not cut the caller's own client."""


class AsyncGuardTransport(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        _admit(request)
        inner: httpx2.AsyncBaseTransport = _WRAPPED[self][0]
        return await inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Nothing, as :meth:`GuardTransport.close`."""


def _wrap(transport: Any, owner: Any) -> Any:
    if transport is None or isinstance(transport, GuardTransport | AsyncGuardTransport):
        return transport
    wrapper = AsyncGuardTransport() if isinstance(owner, httpx2.AsyncClient) else GuardTransport()
    _WRAPPED[wrapper] = (transport, owner)
    return wrapper


def guarded_http_client(http_client: Any) -> Any:
    """A copy of the SDK's httpx client (same pool, proxies, limits, hooks) whose transports
    refuse billable requests the guard is not sending. Guarding a guarded one returns it."""
    if isinstance(getattr(http_client, "_transport", None), GuardTransport | AsyncGuardTransport):
        return http_client
    if not isinstance(http_client, httpx2.Client | httpx2.AsyncClient):
        raise TypeError(
            f"llm_budgets guards SDK clients built on httpx2; got http_client {http_client!r}."
        )
    guarded = copy.copy(http_client)
    guarded._transport = _wrap(http_client._transport, http_client)
    guarded._mounts = {
        pattern: _wrap(transport, http_client) for pattern, transport in http_client._mounts.items()
    }
    return guarded


def unguarded_http_client(http_client: Any) -> Any:
    """The httpx client a guarded one was copied from (``http_client`` if it is not one)."""
    transport = getattr(http_client, "_transport", None)
    wrapped = _WRAPPED.get(transport) if transport is not None else None
    return http_client if wrapped is None else wrapped[1]
