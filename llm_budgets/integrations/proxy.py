"""The guarded client's shape: a proxy that denies by default. Each attribute of the SDK's client
(and of the resources with guarded calls) is classified once, by name:

- guarded: a resource proxy (``_children``) or a method the proxy defines (``create``...);
- free: passed through untouched, because it bills nothing (``files``, ``models``, config);
- refused: raises ``NotGuarded`` before anything is sent (``_refused``).

Anything not classified, such as a resource a new SDK release adds, is refused as well, and
:func:`unclassified` names it so a test can fail until it is classified. Below the proxy, the
SDK client it wraps sends through a transport that refuses what gets around it
(:mod:`llm_budgets.integrations.transport`, installed by :func:`guarded_copy`).
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Any

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.guarding import GuardOptions, NotGuarded
from llm_budgets.integrations.headers import check_client
from llm_budgets.integrations.transport import guarded_http_client, unguarded_http_client

# What both SDKs' clients share (the same generator makes them): configuration that bills
# nothing, and the raw HTTP and raw-response paths the guard cannot see through.
CLIENT_CONFIG = frozenset(
    {
        "api_key",
        "base_url",
        "timeout",
        "max_retries",
        "auth_headers",
        "custom_auth",
        "default_headers",
        "default_query",
        "platform_headers",
        "qs",
        "user_agent",
        "close",
        "is_closed",
    }
)
RAW_RESPONSES = frozenset({"with_raw_response", "with_streaming_response"})
RAW_HTTP = RAW_RESPONSES | {"post", "get", "put", "patch", "delete", "request", "get_api_list"}


class ClientProxy:
    """``_children``: attribute name -> proxy class for a resource with guarded calls.
    ``_free``: names passed through (they bill nothing). ``_refused``: names refused on purpose
    (everything else is refused too; the list says the refusal was decided, not missed)."""

    _sdk = ""
    _children: dict[str, type[ClientProxy]] = {}
    _free: frozenset[str] = frozenset()
    _refused: frozenset[str] = frozenset()
    _instead = ""

    def __init__(self, target: Any, options: GuardOptions, path: str = "") -> None:
        self._target = target
        self._options = options
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        path = f"{self._path}.{name}" if self._path else name
        child = self._children.get(name)
        if child is not None:
            return child(getattr(self._target, name), self._options, path)
        if name in self._free:
            return getattr(self._target, name)
        raise NotGuarded(f"{self._sdk} client.{path}", instead=self._instead)

    def __repr__(self) -> str:
        return f"<guarded {self._target!r} for tenant {self._options.tenant!r}>"

    @property
    def unguarded(self) -> Any:
        """The one escape hatch, for what the guard does not cover (your own hold needed): a
        fresh copy of the SDK client (``.unguarded`` of a resource: that resource on the copy)
        on the caller's own httpx client, with the caller's retries. Using it leaves the
        guarded client as guarded as before."""
        client = self._target._client if self._path else self._target
        raw = type(client).copy(
            client,
            http_client=unguarded_http_client(client._client),
            max_retries=self._options.max_retries,
        )
        if hasattr(raw, "websocket_base_url"):
            raw.websocket_base_url = _WEBSOCKET_URLS.get(client)
        for name in filter(None, self._path.split(".")):
            raw = getattr(raw, name)
        return raw

    @property
    def is_async(self) -> bool:
        return "Async" in type(self._target).__name__

    @classmethod
    def guarded_names(cls) -> frozenset[str]:
        """The resources and methods this proxy guards."""
        own = {
            name
            for klass in cls.__mro__
            if klass is not ClientProxy and issubclass(klass, ClientProxy)
            for name in vars(klass)
            if not name.startswith("_")
        }
        return frozenset(own | set(cls._children))

    @classmethod
    def classified(cls) -> frozenset[str]:
        return cls.guarded_names() | cls._free | cls._refused


def public_names(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def unclassified(
    proxy: type[ClientProxy], sdk_classes: dict[str, tuple[type, ...]]
) -> dict[str, set[str]]:
    """The public names of the SDK's classes that ``proxy`` does not classify, by path from the
    client (``""``: the client; ``"chat.completions"``: that resource). Refused at run time; a
    sign that the SDK grew something to look at."""
    found: dict[str, set[str]] = {}
    for path, classes in sdk_classes.items():
        resource = proxy
        for name in filter(None, path.split(".")):
            resource = resource._children[name]
        names: set[str] = set().union(*(public_names(klass) for klass in classes))
        missing = names - resource.classified() - public_names(ClientProxy)
        if missing:
            found[path or "client"] = missing
    return found


# WebSocket sessions (openai's realtime, responses.connect) do not go through httpx, so no
# transport sees them: the SDK copy the guard sends with, and every copy of it, gets a WebSocket
# address with a scheme no WebSocket client accepts (refused before any network). The caller's
# own address, per copy, for ``.unguarded``.
REFUSED_WEBSOCKET_URL = "refused-by-llm-budgets://websockets-are-not-guarded/"
_WEBSOCKET_URLS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def guarded_copy(
    client: Any, options: GuardOptions, kwargs: dict[str, Any]
) -> tuple[Any, GuardOptions]:
    """The SDK client the guard sends with: ``without_sdk_retries``, on an httpx client whose
    transport refuses billable requests the guard does not send (:mod:`.transport`), its
    headers, query and base URL checked (:mod:`.headers`). Copies made from it (its own
    ``with_options``, reachable through any resource's ``_client``) keep that transport."""
    kwargs = dict(kwargs)
    websocket = kwargs.get("websocket_base_url") or _WEBSOCKET_URLS.get(
        client, getattr(client, "websocket_base_url", None)
    )
    kwargs["http_client"] = guarded_http_client(kwargs.get("http_client") or client._client)
    copied, options = without_sdk_retries(client, options, kwargs)
    check_client(copied)
    _keep_transport(copied, websocket)
    return copied, options


def _keep_transport(client: Any, websocket: Any) -> None:
    """Make ``client.with_options`` / ``copy`` guard an ``http_client`` they are given and
    refuse WebSockets again, so no copy of the guarded client sends around the transport."""
    sdk_copy = type(client).copy
    if hasattr(client, "websocket_base_url"):
        client.websocket_base_url = REFUSED_WEBSOCKET_URL
    _WEBSOCKET_URLS[client] = websocket

    def copy(**kwargs: Any) -> Any:
        if kwargs.get("http_client") is not None:
            kwargs["http_client"] = guarded_http_client(kwargs["http_client"])
        copied = sdk_copy(client, **kwargs)
        _keep_transport(copied, websocket)
        return copied

    client.copy = client.with_options = copy


def without_sdk_retries(
    client: Any, options: GuardOptions, kwargs: dict[str, Any]
) -> tuple[Any, GuardOptions]:
    """``client.with_options(**kwargs)`` with the SDK's own retries turned off and handed to the
    guard, which retries each attempt under a hold of its own (a timed-out attempt may have been
    billed, so it stays counted while the retry runs)."""
    kwargs = dict(kwargs)
    retries = kwargs.pop("max_retries", options.max_retries)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidUsage("max_retries must be a whole number, 0 or more.", field="max_retries")
    return client.with_options(max_retries=0, **kwargs), replace(options, max_retries=retries)
