"""A Python client for the REST API, for services outside the Django process::

    from llm_budgets.client import BudgetsClient

    client = BudgetsClient("https://app.example.com/api/llm-budgets/v1/", api_key)
    with client.reserve(model="gpt-4o", input_tokens=1200, max_output_tokens=800) as hold:
        response = call_the_model(...)
        hold.commit(input_tokens=..., output_tokens=...)

The same shape as ``llm_budgets.budgets`` and the same exception classes (rebuilt from the JSON
error body), so code moves between in-process and HTTP unchanged. Needs ``httpx`` (the ``client``
extra) and no Django settings.

``AsyncBudgetsClient`` is the same over ``httpx.AsyncClient``, with the in-process async twins'
names (``await client.astatus(...)``, ``async with client.areserve(...) as hold:``,
``await hold.acommit(...)``). Each operation is defined once, for both (``_Api``): it builds its
requests and parses their answers; the two clients only send them.

Retries: only calls that are safe to repeat are retried: GETs, and POSTs that carry an
``Idempotency-Key``. Every POST gets a fresh key unless you pass one (``idempotency_key=...``) or
construct the client with ``auto_idempotency_keys=False``. A retry happens after a transport error,
a ``503`` (ledger unavailable), a throttled ``429`` or a ``409 idempotency_in_progress``, waiting
for ``Retry-After`` (capped); never after a budget refusal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import (
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    Self,
    TypeAlias,
    TypeVar,
    cast,
)
from urllib.parse import quote

import httpx

from llm_budgets.exceptions import BudgetError, Fault, Wire
from llm_budgets.holds import Admission, AsyncHoldPolicy, HoldPolicy, ttl_renamed
from llm_budgets.request import Request
from llm_budgets.results import (
    BudgetStatus,
    ClosedRun,
    CommitResult,
    HoldState,
    KillSwitchResult,
    hold_state,
)
from llm_budgets.usage import Usage, usage_keywords

logger = logging.getLogger("llm_budgets.client")

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")
HoldT = TypeVar("HoldT")
H = TypeVar("H", bound=AsyncHoldPolicy)

__all__ = [
    "API_ERROR_CODES",
    "ApiError",
    "AsyncBudgetsClient",
    "AsyncRemoteHold",
    "BudgetsClient",
    "RemoteBudgetStatus",
    "RemoteCommitResult",
    "RemoteHold",
    "RemoteKillSwitch",
    "RemoteQuote",
]

RETRYABLE_CODES = {"ledger_unavailable", "throttled", "idempotency_in_progress"}

# The REST API's own error codes, which no in-process exception class says (those map to their
# class by its ``code``): a caller receives them as :class:`ApiError` with ``.code`` set. A code the
# server can send must be here or on an exception class (tests/test_client_parity.py).
API_ERROR_CODES: dict[str, str] = {
    # 400: the request itself
    "parse_error": "the body is not valid JSON",
    "too_deeply_nested": "the JSON body is nested more than 64 levels",
    "invalid_encoding": "the body is not UTF-8",
    # 401: no key, or a bad one
    "not_authenticated": "no API key was sent",
    "authentication_failed": "the API key was refused",
    "malformed_api_key": "the header is not exactly `Api-Key <prefix>.<secret>`",
    "invalid_api_key": "no such API key, or the secret is wrong",
    "api_key_revoked": "the API key was revoked",
    "api_key_expired": "the API key expired",
    # 403, 404, 405, 406, 415: what the key may do, where the request went
    "operator_key_required": "the operation needs an operator key",
    "self_serve_key_required": "the operation needs a tenant key with the self_serve scope",
    "permission_denied": "the key may not do this",
    "not_found": "no such path or object (or another tenant's)",
    "alert_endpoint_not_found": "no such alert endpoint (or another tenant's)",
    "alert_delivery_not_found": "no such alert delivery (or another tenant's)",
    "method_not_allowed": "the path does not take this HTTP method",
    "not_acceptable": "the server cannot answer in the Accept header's type",
    "unsupported_media_type": "the body's content type is not JSON",
    # 409: idempotency
    "idempotency_in_progress": "the first request with this Idempotency-Key is still running",
    # 413, 429
    "request_too_large": "the body is larger than the server's DATA_UPLOAD_MAX_MEMORY_SIZE",
    "throttled": "too many requests for this key, or failed attempts from this address",
    # any status: an APIException with no code of its own
    "error": "the server's generic error",
    # made by this client, never sent: the answer was not the API's error shape
    "http_error": "an HTTP error without the API's JSON error body (e.g. a proxy's page)",
}


class ApiError(BudgetError):
    """An HTTP-level error with no in-process equivalent (authentication, permission, not found
    path, idempotency conflict, not implemented, an unexpected status). Its ``fault`` follows
    the status it came with: a 5xx is the server's (a dependency of the caller), else the
    caller's."""

    code = "api_error"
    fault = Fault.CALLER

    def __init__(self, message: str, *, status_code: int, code: str, **context: Any) -> None:
        self.status_code = status_code
        self.code = code
        self.fault = Fault.DEPENDENCY if status_code >= 500 else Fault.CALLER
        super().__init__(message, status_code=status_code, **context)


def _subclasses(cls: type[BudgetError]) -> list[type[BudgetError]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _error_class(code: str) -> type[BudgetError] | None:
    """The exception class whose own ``code`` is ``code`` (new classes map themselves)."""
    candidates: list[type[BudgetError]] = [BudgetError, *_subclasses(BudgetError)]
    for cls in candidates:
        if cls.__dict__.get("code") == code and cls is not ApiError:
            return cls
    return None


def _money(value: Any) -> Decimal:
    return Decimal(str(value))


def _when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


def _decoded(wire: Wire, value: Any) -> Any:
    if value is None:
        return None
    if wire.kind == "money":
        return _money(value)
    if wire.kind == "time":
        return _when(value)
    return value


def error_from_response(response: httpx.Response) -> BudgetError:
    """Rebuild the server's exception from ``{"error": {"code", "message", ...}}``: the class
    whose ``code`` it is, with every attribute its ``wire`` sends (``llm_budgets.exceptions.Wire``),
    as the in-process exception has them."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return ApiError(
            f"HTTP {response.status_code} from {response.request.url}: {response.text[:200]}",
            status_code=response.status_code,
            code="http_error",
        )
    details = {k: v for k, v in error.items() if k not in ("code", "message", "fields")}
    cls = _error_class(code)
    if cls is None and code not in API_ERROR_CODES:
        logger.warning("llm_budgets: unknown error code %r (is the server newer?)", code)
    if cls is None:
        return ApiError(message, status_code=response.status_code, code=code, **details)
    exc = cls.__new__(cls)
    attributes = {}
    for wire in cls.wire:
        value: Any = error
        for name in wire.where:
            value = value.get(name) if isinstance(value, dict) else None
        attributes[wire.attr] = _decoded(wire, value)
    if "retry_after" not in attributes and response.headers.get("Retry-After", "").isdigit():
        attributes["retry_after"] = int(response.headers["Retry-After"])
    # A class that declares no wire (e.g. a host's): its top-level details as they came.
    sent = {wire.where[0] for wire in cls.wire}
    extra = {k: v for k, v in details.items() if k not in sent}
    BudgetError.__init__(exc, message, **extra, **attributes)
    for key, value in {**extra, **attributes}.items():
        if not isinstance(getattr(cls, key, None), property):  # e.g. BudgetExceeded.retry_after
            setattr(exc, key, value)
    return exc


def _scope_body(
    tenant: str | None,
    end_user: str | None,
    provider: str | None,
    model: str | None,
    api_key: str | None,
    reason: str,
    run: str | None = None,
) -> dict[str, Any]:
    scope = {
        "tenant": tenant,
        "end_user": end_user,
        "provider": provider,
        "model": model,
        "api_key": api_key,
        "run": run,
    }
    return {**{k: v for k, v in scope.items() if v is not None}, "reason": reason}


# The in-process result class itself (``llm_budgets.results``); the old name stays.
RemoteCommitResult = CommitResult


def _decimals(row: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: _money(v) if k in names and v is not None else v for k, v in row.items()}


@dataclass(frozen=True)
class RemoteQuote:
    """``GET /quote``: the fields of ``llm_budgets.results.Quote``, flattened, money as
    Decimal.
    ``items`` and ``budgets`` are dicts as the API returns them, amounts as Decimal."""

    provider: str | None
    model: str
    input_tokens: int
    max_output_tokens: int
    pricing_basis: str
    price: dict[str, Any] | None
    items: list[dict[str, Any]]
    amount: Decimal
    markup_percent: Decimal
    customer_amount: Decimal
    currency: str
    budgets: list[dict[str, Any]]
    admissible: bool
    input_tolerance: Decimal = Decimal(0)  # of amount, the input tolerance
    customer_input_tolerance: Decimal = Decimal(0)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RemoteQuote:
        budget_money = ("limit", "spent", "reserved", "remaining")
        return cls(
            provider=data["provider"],
            model=data["model"],
            input_tokens=int(data["input_tokens"]),
            max_output_tokens=int(data["max_output_tokens"]),
            pricing_basis=data["pricing_basis"],
            price=data["price"],
            items=[_decimals(item, ("rate", "amount")) for item in data["items"]],
            amount=_money(data["amount"]),
            markup_percent=_money(data["markup_percent"]),
            customer_amount=_money(data["customer_amount"]),
            currency=data["currency"],
            budgets=[
                {
                    **_decimals(draw["budget"], budget_money),
                    "would_hold": _money(draw["would_hold"]),
                    "fits": draw["fits"],
                }
                for draw in data["budgets"]
            ],
            admissible=bool(data["admissible"]),
            # A server older than issue #38 sends neither (its holds did not include it).
            input_tolerance=_money(data.get("input_tolerance", 0)),
            customer_input_tolerance=_money(data.get("customer_input_tolerance", 0)),
        )


def _kill_switch(data: dict[str, Any]) -> KillSwitchResult:
    """A kill switch from the API's body: the in-process result class, times as datetimes."""
    fields: dict[str, Any] = {f: data.get(f) for f in KillSwitchResult.__dataclass_fields__}
    for name in ("tripped_at", "auto_clear_at", "cleared_at"):
        fields[name] = _when(fields[name])
    return KillSwitchResult(**fields)


# The name this class had before the in-process API returned the same one (issue 24).
RemoteKillSwitch = KillSwitchResult


@dataclass(frozen=True)
class RemoteBudgetStatus(BudgetStatus):
    """One budget's standing: the in-process ``llm_budgets.results.BudgetStatus`` (money as
    Decimal, times as datetimes), plus the body as sent in ``data``. ``status["limit"]`` also
    works and gives the value as the API sent it, as the plain dicts this method returned before
    did."""

    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RemoteBudgetStatus:
        money = ("limit", "spent", "reserved", "remaining", "raised")
        values = {f.name: data[f.name] for f in fields(cls) if f.name != "data" and f.name in data}
        values.update({k: _money(values[k]) for k in money if k in values})
        if values.get("projected") is not None:
            values["projected"] = _money(values["projected"])
        values.update(
            {
                k: _when(values[k])
                for k in ("period_start", "resets_at", "runs_out_at")
                if k in values
            }
        )
        legacy = {k: _money(v) if k in money[:4] else v for k, v in data.items()}
        return cls(**values, data=legacy)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def keys(self) -> Any:
        return self.data.keys()


# One definition of each operation, for both clients: a generator that builds the requests
# (``_Call``), is sent each answer's JSON, and parses the result. ``BudgetsClient`` drives it with
# ``httpx.Client``, ``AsyncBudgetsClient`` with ``httpx.AsyncClient`` (``_blocking`` and
# ``_awaiting`` make the public methods, with the operation's own signature and docstring).


@dataclass(frozen=True)
class _Call:
    """One request of an operation. ``idempotency_key``: a POST's own (else one is made, unless
    ``auto_idempotency_keys`` is off)."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, str] | None = None
    idempotency_key: str | None = None


def _post(path: str, body: dict[str, Any], idempotency_key: str | None = None) -> _Call:
    return _Call("POST", path, body=body, idempotency_key=idempotency_key)


def _get(path: str, params: dict[str, str] | None = None) -> _Call:
    return _Call("GET", path, params=params)


# An operation: yields its requests, is sent each answer's JSON (or thrown its error), returns
# its result.
Steps: TypeAlias = Generator[_Call, Any, T]


class _Drives(Protocol):
    def _drive(self, steps: Steps[T]) -> T: ...


class _AsyncDrives(Protocol):
    async def _adrive(self, steps: Steps[T]) -> T: ...


def _public(steps: Callable[..., Any], name: str) -> Callable[[Callable[..., Any]], None]:
    def name_it(method: Callable[..., Any]) -> None:
        owner, dot, _ = steps.__qualname__.rpartition(".")
        method.__name__ = name
        method.__qualname__ = owner + dot + name

    return name_it


def _blocking(steps: Callable[Concatenate[S, P], Steps[T]]) -> Callable[Concatenate[S, P], T]:
    """The sync method of an operation: its parameters and docstring, run by ``_drive``."""

    @functools.wraps(steps)
    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return cast(_Drives, self)._drive(steps(self, *args, **kwargs))

    _public(steps, steps.__name__.lstrip("_"))(method)
    return method


def _awaiting(
    steps: Callable[Concatenate[S, P], Steps[T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The async method of an operation (``a`` + its name), run by ``_adrive``."""

    @functools.wraps(steps)
    async def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await cast(_AsyncDrives, self)._adrive(steps(self, *args, **kwargs))

    _public(steps, "a" + steps.__name__.lstrip("_"))(method)
    return method


def _admitting(
    steps: Callable[Concatenate[S, P], Steps[H]],
) -> Callable[Concatenate[S, P], Admission[H]]:
    """``areserve``: an ``Admission`` of the operation (``await`` it, or ``async with`` it)."""

    @functools.wraps(steps)
    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Admission[H]:
        return Admission(lambda: cast(_AsyncDrives, self)._adrive(steps(self, *args, **kwargs)))

    _public(steps, "a" + steps.__name__.lstrip("_"))(method)
    return method


class _RemoteHoldData:
    """What both remote holds are: the reservation as the API last returned it, and the
    operations on it."""

    _client: _Api[Any]

    def __init__(self, client: _Api[Any], data: dict[str, Any]) -> None:
        self._client = client
        self._data = data

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.amount} {self.currency} {self.state}>"

    @property
    def id(self) -> uuid.UUID:
        return uuid.UUID(self._data["id"])

    @property
    def amount(self) -> Decimal:
        return _money(self._data["amount"])

    @property
    def currency(self) -> str:
        return str(self._data["currency"])

    @property
    def expires_at(self) -> datetime:
        expires_at = _when(self._data["expires_at"])
        assert expires_at is not None
        return expires_at

    @property
    def state(self) -> HoldState:
        return hold_state(self._data["state"])

    @property
    def model(self) -> str:
        return str(self._data["model"])

    @property
    def max_output_tokens(self) -> int:
        return int(self._data["max_output_tokens"])

    @property
    def degraded(self) -> bool:
        return bool(self._data.get("degraded", False))

    @property
    def requested_model(self) -> str:
        """The model asked for (as ``budgets.Hold.requested_model``): differs from ``model``
        when the degradation ladder granted another."""
        return str(self._data.get("requested_model") or self._data["model"])

    @property
    def data(self) -> dict[str, Any]:
        """The reservation as the API last returned it."""
        return dict(self._data)

    def _commit(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls: dict[str, int] | None = None,
        usage: Usage | None = None,
    ) -> Steps[RemoteCommitResult]:
        """Charge actual usage; returns ``cost`` and ``overage``. Idempotent. Counts as in
        ``budgets.Hold.commit``: ``input_tokens`` includes cache reads and writes, or pass
        ``usage=llm_budgets.usage.from_anthropic(response.usage)``."""
        result = yield from self._client._commit(self.id, **usage_keywords(locals()), usage=usage)
        self._data["state"] = result.state
        return result

    def _release(self) -> Steps[HoldState]:
        """Drop the hold (the call produced nothing). Returns the final state."""
        self._data = yield _post(f"reservations/{self.id}/release", {})
        return self.state

    def _extend(self, *, ttl: int | None = None, ttl_seconds: int | None = None) -> Steps[Self]:
        """Push the expiry to ``ttl`` seconds from now (never earlier). (``ttl_seconds``: the
        old name, deprecated.)"""
        seconds = ttl_renamed(ttl, ttl_seconds, where="extend")
        self._data = yield from self._client._extended(self.id, seconds)
        return self

    def _mark_uncertain(self) -> Steps[HoldState]:
        """The call's outcome is unknown: keep the hold counted until usage arrives or the
        reconcile job settles it. Returns the state."""
        self._data = yield from self._client._marked_uncertain(self.id)
        return self.state

    def _refresh(self) -> Steps[Self]:
        self._data = yield _get(f"reservations/{self.id}")
        return self

    def _timed_out_steps(self) -> Steps[None]:
        try:
            yield from self._mark_uncertain()
        except ApiError as error:
            if error.code != "not_implemented":  # a server without the UNCERTAIN state
                raise


class RemoteHold(_RemoteHoldData, HoldPolicy):
    """A reservation held over HTTP; the interface of ``llm_budgets.budgets.Hold`` and its
    with-block policy (``llm_budgets.holds.HoldPolicy``), an HTTP timeout counting as one."""

    _timeouts = (*HoldPolicy._timeouts, httpx.TimeoutException)
    _client: BudgetsClient

    commit = _blocking(_RemoteHoldData._commit)
    extend = _blocking(_RemoteHoldData._extend)
    refresh = _blocking(_RemoteHoldData._refresh)

    def release(self) -> HoldState:
        """Drop the hold (the call produced nothing). Returns the final state."""
        return self._drive(self._release())

    def mark_uncertain(self) -> HoldState:
        """The call's outcome is unknown: keep the hold counted until usage arrives or the
        reconcile job settles it. Returns the state."""
        return self._drive(self._mark_uncertain())

    def _drive(self, steps: Steps[T]) -> T:
        return self._client._drive(steps)

    def _timed_out(self) -> None:
        self._drive(self._timed_out_steps())


class AsyncRemoteHold(_RemoteHoldData, AsyncHoldPolicy):
    """``RemoteHold`` for ``AsyncBudgetsClient``: ``await hold.acommit(...)``, ``arelease()``,
    ``aextend(...)``, ``amark_uncertain()``, ``arefresh()``, and ``async with`` leaving by the
    with-block policy (``llm_budgets.holds``), an HTTP timeout or a cancelled task counting as a
    timeout."""

    _timeouts = (*AsyncHoldPolicy._timeouts, httpx.TimeoutException)
    _client: AsyncBudgetsClient

    acommit = _awaiting(_RemoteHoldData._commit)
    aextend = _awaiting(_RemoteHoldData._extend)
    arefresh = _awaiting(_RemoteHoldData._refresh)

    async def arelease(self) -> HoldState:
        """``await`` twin of ``release``."""
        return await self._adrive(self._release())

    async def amark_uncertain(self) -> HoldState:
        """``await`` twin of ``mark_uncertain``."""
        return await self._adrive(self._mark_uncertain())

    async def _adrive(self, steps: Steps[T]) -> T:
        return await self._client._adrive(steps)

    async def _atimed_out(self) -> None:
        await self._adrive(self._timed_out_steps())


class _Api(Generic[HoldT]):
    """What both clients share: the configuration, each operation (``_reserve``, ...: see
    ``Steps``), and the retry rule (:meth:`_verdict`)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        max_retries: int,
        max_retry_wait: float,
        auto_idempotency_keys: bool,
    ) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self.auto_idempotency_keys = auto_idempotency_keys
        self._headers = {"Authorization": f"Api-Key {api_key}", "Accept": "application/json"}

    def _held(self, data: dict[str, Any]) -> HoldT:
        raise NotImplementedError

    # The in-process API's functions.

    def _reserve(
        self,
        *,
        model: str,
        input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        tenant: str | None = None,
        end_user: str | None = None,
        provider: str | None = None,
        idempotency_key: str | None = None,
        ttl: int | None = None,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        max_tool_calls: dict[str, int] | None = None,
        tags: dict[str, str] | None = None,
        allow_degrade: bool = False,
        run: str | None = None,
    ) -> Steps[HoldT]:
        """Admit a call and hold its worst-case cost, or raise the ``BudgetError`` that says
        why. ``tenant`` is implied by a tenant key and required with an operator key. Give
        ``input_tokens``, or ``messages`` / ``prompt`` for the server to count. With
        ``allow_degrade`` the plan's ladder may grant less: read ``hold.model``,
        ``hold.max_output_tokens`` and ``hold.degraded``."""
        call = Request.from_arguments(locals())
        return self._held((yield _post("reservations", call.wire(), idempotency_key)))

    def _quote(
        self,
        *,
        model: str,
        input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        tenant: str | None = None,
        end_user: str | None = None,
        provider: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        max_tool_calls: dict[str, int] | None = None,
        ttl: int | None = None,
        run: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> Steps[RemoteQuote]:
        """Explain a price without holding anything: the itemised worst case, the price version
        (or policy) and each budget the request would draw on, with whether it fits now."""
        call = Request.from_arguments(locals())
        return RemoteQuote.from_json((yield _get("quote", params=call.wire(query=True))))

    def _close_run(
        self,
        *,
        run: str,
        tenant: str | None = None,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> Steps[ClosedRun]:
        """Close a run, as ``budgets.close_run``: later reservations naming it are refused
        (``RunClosed``); the API key is recorded as who closed it."""
        body: dict[str, Any] = {"run": run, "reason": reason}
        if tenant is not None:
            body["tenant"] = tenant
        data = yield _post("runs/close", body, idempotency_key)
        return ClosedRun(
            tenant=data["tenant"],
            run=data["run"],
            closed_at=datetime.fromisoformat(data["closed_at"]),
        )

    def _get(self, hold_id: uuid.UUID | str) -> Steps[HoldT]:
        """A reservation by id, e.g. to settle it from another process."""
        return self._held((yield _get(f"reservations/{hold_id}")))

    def _commit(
        self,
        hold_id: uuid.UUID | str,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls: dict[str, int] | None = None,
        usage: Usage | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[RemoteCommitResult]:
        """Commit a reservation by id; counts as in ``RemoteHold.commit``."""
        if usage is not None:
            body = usage.as_fields()
        else:
            body = usage_keywords(locals())
            if not tool_calls:
                del body["tool_calls"]
        data = yield _post(f"reservations/{hold_id}/commit", body, idempotency_key)
        return RemoteCommitResult(
            reservation_id=uuid.UUID(data["id"]),
            state=data["state"],
            cost=_money(data["cost"]),
            reserved=_money(data["reserved"]),
            overage=_money(data["overage"]),
            currency=data["currency"],
            customer_cost=_money(data.get("customer_cost", 0)),
            pricing_basis=data.get("pricing_basis", "price"),
        )

    def _release(self, hold_id: uuid.UUID | str) -> Steps[HoldState]:
        """Release a reservation by id. Returns its final state."""
        return hold_state((yield _post(f"reservations/{hold_id}/release", {}))["state"])

    def _status(
        self,
        *,
        tenant: str,
        end_user: str | None = None,
        run: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> Steps[list[RemoteBudgetStatus]]:
        """Every budget that applies to the tenant (and end user, run and tags), as
        ``budgets.status``: limit, spent, reserved, remaining, period start and ``resets_at``."""
        asked = {
            "end_user": end_user,
            "run": run,
            "tags": None if tags is None else json.dumps(tags),
        }
        params = {k: v for k, v in asked.items() if v is not None} or None
        data = yield _get(f"tenants/{quote(tenant, safe='')}/status", params=params)
        return [RemoteBudgetStatus.from_json(budget) for budget in data["budgets"]]

    def _extend(
        self, hold_id: uuid.UUID | str, *, ttl: int | None = None, ttl_seconds: int | None = None
    ) -> Steps[HoldT]:
        """Push a held reservation's expiry to ``ttl`` seconds from now (never earlier).
        (``ttl_seconds``: the old name, deprecated.)"""
        seconds = ttl_renamed(ttl, ttl_seconds, where="extend")
        return self._held((yield from self._extended(hold_id, seconds)))

    def _extended(self, hold_id: uuid.UUID | str, seconds: int) -> Steps[dict[str, Any]]:
        data: dict[str, Any] = yield _post(
            f"reservations/{hold_id}/extend", {"ttl_seconds": seconds}
        )
        return data

    def _mark_uncertain(self, hold_id: uuid.UUID | str) -> Steps[HoldState]:
        """The call's outcome is unknown (by id, e.g. from a watchdog): keep its hold counted
        until usage arrives or the reconcile job settles it. Returns the state."""
        return hold_state((yield from self._marked_uncertain(hold_id))["state"])

    def _marked_uncertain(self, hold_id: uuid.UUID | str) -> Steps[dict[str, Any]]:
        data: dict[str, Any] = yield _post(f"reservations/{hold_id}/uncertain", {})
        return data

    # Kill switches (operator keys). No scope: global; several: their intersection.

    def _trip(
        self,
        *,
        reason: str,
        tenant: str | None = None,
        end_user: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        auto_clear_at: datetime | None = None,
        run: str | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[KillSwitchResult]:
        """Refuse every admission in the scope now; returns the open switch (an already
        tripped scope keeps its switch and first reason). ``api_key``: a key's prefix."""
        body = _scope_body(tenant, end_user, provider, model, api_key, reason, run)
        if auto_clear_at is not None:
            body["auto_clear_at"] = auto_clear_at.isoformat()
        return _kill_switch((yield _post("kill-switches", body, idempotency_key)))

    def _clear(
        self,
        *,
        reason: str,
        tenant: str | None = None,
        end_user: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        run: str | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[KillSwitchResult]:
        """Clear the switch tripped on exactly this scope (``InvalidUsage`` if none is)."""
        body = _scope_body(tenant, end_user, provider, model, api_key, reason, run)
        data = yield _post("kill-switches/clear", body, idempotency_key)
        return _kill_switch(data)

    def _kill_switches(
        self, *, state: str | None = None, tenant: str | None = None
    ) -> Steps[list[KillSwitchResult]]:
        """Every switch, newest first; ``state``: ``"open"`` or ``"cleared"``."""
        params = {k: v for k, v in {"state": state, "tenant": tenant}.items() if v is not None}
        switches: list[KillSwitchResult] = []
        while True:
            page = yield _get("kill-switches", params={**params, "offset": str(len(switches))})
            switches.extend(_kill_switch(item) for item in page["results"])
            if not page.get("next") or not page["results"]:
                return switches

    # Transport: what is sent, and what each attempt's outcome means.

    def _prepared(self, call: _Call) -> tuple[dict[str, Any], int]:
        """The arguments of ``httpx``'s ``request`` for ``call``, and how many attempts it may
        take: GETs, and POSTs that carry an ``Idempotency-Key``, are safe to repeat."""
        headers = dict(self._headers)
        retryable = call.method == "GET"
        if call.method == "POST":
            key = call.idempotency_key or (
                str(uuid.uuid4()) if self.auto_idempotency_keys else None
            )
            if key is not None:
                headers["Idempotency-Key"] = key
                retryable = True
        request: dict[str, Any] = {
            "method": call.method,
            "url": self.base_url + call.path,
            "headers": headers,
        }
        if call.body is not None:
            request["json"] = call.body
        if call.params is not None:
            request["params"] = call.params
        return request, 1 + (self.max_retries if retryable else 0)

    def _verdict(
        self, outcome: httpx.Response | httpx.TransportError, attempt: int, attempts: int
    ) -> tuple[bool, Any]:
        """``(True, json)`` for an answer; ``(False, seconds)`` to wait before the next attempt;
        raises the error to give up with (a transport error, or the server's, rebuilt)."""
        if isinstance(outcome, httpx.TransportError):
            if attempt == attempts:
                raise outcome
            return False, min(self.max_retry_wait, 0.2 * 2**attempt)
        if outcome.is_success:
            return True, outcome.json()
        error = error_from_response(outcome)
        if attempt == attempts or error.code not in RETRYABLE_CODES:
            raise error
        wait = outcome.headers.get("Retry-After", "")
        return False, min(self.max_retry_wait, int(wait) if wait.isdigit() else 0.2 * 2**attempt)


class BudgetsClient(_Api[RemoteHold]):
    """HTTP client for ``llm_budgets.api`` (``base_url`` ends at the mount, e.g. ``.../v1/``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 2,
        max_retry_wait: float = 5.0,
        auto_idempotency_keys: bool = True,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            max_retries=max_retries,
            max_retry_wait=max_retry_wait,
            auto_idempotency_keys=auto_idempotency_keys,
        )
        self._sleep = sleep
        self._http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BudgetsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # The in-process API's functions (each defined once, in ``_Api``).
    reserve = _blocking(_Api._reserve)
    quote = _blocking(_Api._quote)
    close_run = _blocking(_Api._close_run)
    get = _blocking(_Api._get)
    commit = _blocking(_Api._commit)
    release = _blocking(_Api._release)
    status = _blocking(_Api._status)
    extend = _blocking(_Api._extend)
    mark_uncertain = _blocking(_Api._mark_uncertain)
    trip = _blocking(_Api._trip)
    clear = _blocking(_Api._clear)
    kill_switches = _blocking(_Api._kill_switches)

    def _held(self, data: dict[str, Any]) -> RemoteHold:
        return RemoteHold(self, data)

    def _drive(self, steps: Steps[T]) -> T:
        try:
            call = next(steps)
            while True:
                try:
                    answer = self._send(call)
                except Exception as error:
                    call = steps.throw(error)
                else:
                    call = steps.send(answer)
        except StopIteration as done:
            return cast(T, done.value)

    def _send(self, call: _Call) -> Any:
        request, attempts = self._prepared(call)
        for attempt in range(1, attempts + 1):
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = self._http.request(**request)
            except httpx.TransportError as error:
                outcome = error
            answered, value = self._verdict(outcome, attempt, attempts)
            if answered:
                return value
            self._sleep(value)
        raise AssertionError("unreachable")


class AsyncBudgetsClient(_Api[AsyncRemoteHold]):
    """``BudgetsClient`` over ``httpx.AsyncClient``, for async services (FastAPI, aiohttp, async
    tasks): the same operations, parameters, results and errors, each ``a``-prefixed and awaited
    as the in-process API's twins are (``await client.astatus(...)``); ``areserve`` returns an
    ``Admission``: ``await`` it for an ``AsyncRemoteHold``, or ``async with`` it::

        async with AsyncBudgetsClient(url, key) as client:
            async with client.areserve(model="gpt-4o", input_tokens=1200,
                                       max_output_tokens=800) as hold:
                ...
                await hold.acommit(input_tokens=..., output_tokens=...)
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 2,
        max_retry_wait: float = 5.0,
        auto_idempotency_keys: bool = True,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            max_retries=max_retries,
            max_retry_wait=max_retry_wait,
            auto_idempotency_keys=auto_idempotency_keys,
        )
        self._sleep = sleep
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncBudgetsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    areserve = _admitting(_Api._reserve)
    aquote = _awaiting(_Api._quote)
    aclose_run = _awaiting(_Api._close_run)
    aget = _awaiting(_Api._get)
    acommit = _awaiting(_Api._commit)
    arelease = _awaiting(_Api._release)
    astatus = _awaiting(_Api._status)
    aextend = _awaiting(_Api._extend)
    amark_uncertain = _awaiting(_Api._mark_uncertain)
    atrip = _awaiting(_Api._trip)
    aclear = _awaiting(_Api._clear)
    akill_switches = _awaiting(_Api._kill_switches)

    def _held(self, data: dict[str, Any]) -> AsyncRemoteHold:
        return AsyncRemoteHold(self, data)

    async def _adrive(self, steps: Steps[T]) -> T:
        try:
            call = next(steps)
            while True:
                try:
                    answer = await self._asend(call)
                except Exception as error:
                    call = steps.throw(error)
                else:
                    call = steps.send(answer)
        except StopIteration as done:
            return cast(T, done.value)

    async def _asend(self, call: _Call) -> Any:
        request, attempts = self._prepared(call)
        for attempt in range(1, attempts + 1):
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = await self._http.request(**request)
            except httpx.TransportError as error:
                outcome = error
            answered, value = self._verdict(outcome, attempt, attempts)
            if answered:
                return value
            await self._sleep(value)
        raise AssertionError("unreachable")
