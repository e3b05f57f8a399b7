"""``llm_budgets.client`` works like the in-process API (issue #10, item 2): the same methods
with the same parameters, the same attributes, the same exception fields and the same return
types, checked by introspection and by running one scenario through every surface against a
live server: the in-process API, its async twins (issue #31), ``BudgetsClient`` and
``AsyncBudgetsClient``."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import json
import subprocess
import sys
import typing
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from llm_budgets import budgets, client, exceptions
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine.settlement import CommitResult
from llm_budgets.models import Budget
from llm_budgets.results import BudgetStatus
from tests.api import BASE, new_key
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def asynchronous(names: set[str]) -> set[str]:
    return {"a" + name for name in names}


# Deliberate differences, each with its reason; anything else must match.
HOLD_ONLY_IN_PROCESS = {"reservation"}  # the model instance itself
# A Hold is both sync and async (Django's convention: ``save`` and ``asave`` on one object); the
# client has a class for each (``RemoteHold``, ``AsyncRemoteHold``).
HOLD_ASYNC = {"acommit", "arelease", "amark_uncertain", "aextend", "arefresh"}
HOLD_ONLY_REMOTE = {"data"}  # the reservation as the API last returned it
# Functions of the in-process API that are not operations of the REST API: configuration and
# operations a host runs in its own process (the REST API is for calls and kill switches).
ONLY_IN_PROCESS = {
    "ensure_tenant",
    "explain",
    "set_limit",
    "set_price",
    "sweep",
    # Billing setup: the REST API has no Stripe-link operation (the admin and the host link).
    "link_stripe_customer",
    "unlink_stripe_customer",
}
# Classes the in-process API exports that are not functions.
EXPORTED_TYPES = {"CommitResult", "Hold", "Quote", "Usage"}
# The in-process API's async twins (``areserve`` beside ``reserve``).
ASYNC_TWINS = {n for n in budgets.__all__ if n.startswith("a") and n[1:] in budgets.__all__}
# Client parameters with no in-process counterpart.
TRANSPORT_PARAMETERS = {"idempotency_key"}
# In-process parameters with no client counterpart: over HTTP the API key is the actor.
ACTOR_PARAMETERS = {"actor"}
# Client methods with no in-process function: listing kill switches (the admin lists them in
# process) and closing the HTTP connection pool.
ONLY_REMOTE = {"kill_switches", "close"}


def parameters(function: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: (p.kind, p.default)
        for name, p in inspect.signature(function).parameters.items()
        if name != "self" and name not in TRANSPORT_PARAMETERS | ACTOR_PARAMETERS
    }


def test_a_remote_hold_has_the_in_process_holds_attributes_and_methods() -> None:
    assert public(budgets.Hold) - HOLD_ONLY_IN_PROCESS - HOLD_ASYNC == public(client.RemoteHold) - (
        HOLD_ONLY_REMOTE
    )
    for name in public(budgets.Hold) - HOLD_ONLY_IN_PROCESS - HOLD_ASYNC:
        here, there = getattr(budgets.Hold, name), getattr(client.RemoteHold, name)
        assert isinstance(here, property) == isinstance(there, property), name
        if callable(here):
            assert parameters(here) == parameters(there), name


def test_the_client_has_every_function_of_the_in_process_api() -> None:
    functions = set(budgets.__all__) - EXPORTED_TYPES - ONLY_IN_PROCESS - ASYNC_TWINS
    methods = public(client.BudgetsClient) - ONLY_REMOTE
    assert functions == methods
    for name in functions:
        here, there = (
            parameters(getattr(budgets, name)),
            parameters(getattr(client.BudgetsClient, name)),
        )
        # The client may leave out the tenant (a tenant key implies it) and reorder
        # keyword-only parameters; names, kinds and defaults match otherwise.
        if "tenant" in there and "tenant" in here:
            here.pop("tenant"), there.pop("tenant")
        assert here == there, name


def test_every_public_function_is_exported_and_typed() -> None:
    """Each public function of ``llm_budgets.budgets`` is in ``__all__`` (so the test above
    holds it to the client's), and says what it takes and returns: no ``**kwargs``, no ``Any``
    return."""
    defined = {
        name
        for name, value in vars(budgets).items()
        if not name.startswith("_")
        and inspect.isfunction(value)
        and value.__module__ == budgets.__name__
    }
    assert defined <= set(budgets.__all__)
    for name in defined:
        function = getattr(budgets, name)
        signature = inspect.signature(function)
        assert all(
            p.kind is not inspect.Parameter.VAR_KEYWORD or name == "set_price"  # price fields
            for p in signature.parameters.values()
        ), name
        hints = typing.get_type_hints(function)
        assert hints.get("return", Any) is not Any, name
    for name in set(budgets.__all__) - EXPORTED_TYPES - ASYNC_TWINS:
        assert name in ONLY_IN_PROCESS or hasattr(client.BudgetsClient, name), name


def test_a_hold_and_a_remote_hold_leave_a_with_block_by_one_policy() -> None:
    from llm_budgets.holds import HoldPolicy

    for cls in (budgets.Hold, client.RemoteHold):
        assert issubclass(cls, HoldPolicy)
        assert "__exit__" not in vars(cls), cls  # inherited: one definition
        assert "__enter__" not in vars(cls), cls


def test_the_async_client_is_the_sync_client_awaited() -> None:
    """``AsyncBudgetsClient`` has each method of ``BudgetsClient``, ``a``-prefixed, with the same
    parameters; ``AsyncRemoteHold`` has ``RemoteHold``'s attributes and its methods
    ``a``-prefixed, as the in-process ``Hold`` has them."""
    sync_methods = public(client.BudgetsClient)
    assert public(client.AsyncBudgetsClient) == asynchronous(sync_methods)
    for name in sync_methods:
        there, awaited = (
            getattr(client.BudgetsClient, name),
            getattr(client.AsyncBudgetsClient, "a" + name),
        )
        assert parameters(there) == parameters(awaited), name
        assert inspect.iscoroutinefunction(awaited) == (name != "reserve"), name
    remote = public(client.RemoteHold)
    attributes = {n for n in remote if isinstance(getattr(client.RemoteHold, n), property)}
    methods = remote - attributes
    assert public(client.AsyncRemoteHold) == attributes | asynchronous(methods)
    assert asynchronous(methods) == HOLD_ASYNC
    for name in methods:
        awaited = getattr(client.AsyncRemoteHold, "a" + name)
        assert inspect.iscoroutinefunction(awaited), name
        assert parameters(getattr(client.RemoteHold, name)) == parameters(awaited), name
        assert parameters(getattr(budgets.Hold, "a" + name)) == parameters(awaited), name


def test_the_in_process_twins_are_the_async_clients_methods() -> None:
    """Code written against ``budgets.areserve``, ``hold.acommit``, ... runs unchanged on an
    ``AsyncBudgetsClient``: the same names and parameters (the client may leave out the tenant,
    as the sync one may)."""
    twins = ASYNC_TWINS - asynchronous(ONLY_IN_PROCESS)
    assert twins == public(client.AsyncBudgetsClient) - asynchronous(ONLY_REMOTE)
    for name in twins:
        here = parameters(getattr(budgets, name))
        there = parameters(getattr(client.AsyncBudgetsClient, name))
        if "tenant" in there and "tenant" in here:
            here.pop("tenant"), there.pop("tenant")
        assert here == there, name
    for cls in (budgets.Hold, client.AsyncRemoteHold):
        assert "__aexit__" not in vars(cls), cls  # inherited: one definition
        assert "__aenter__" not in vars(cls), cls


@pytest.mark.parametrize(
    ("here", "there"),
    [
        (CommitResult, client.RemoteCommitResult),
        (BudgetStatus, client.RemoteBudgetStatus),
    ],
)
def test_results_have_the_same_fields(here: type, there: type) -> None:
    def shape(cls: type) -> list[tuple[str, Any]]:
        hints = typing.get_type_hints(cls)
        return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.name != "data"]

    assert shape(here) == shape(there)


# One scenario through both surfaces.


class InProcess:
    """The in-process API with the client's calling convention."""

    def __getattr__(self, name: str) -> Any:
        return getattr(budgets, name)


class Awaited:
    """An async surface (the in-process twins, ``AsyncBudgetsClient``, their holds) with the sync
    calling convention, for ``scenario``: ``x.name(...)`` runs ``await x.aname(...)`` by
    ``run``; a hold it returns is adapted alike; attributes are read as they are."""

    def __init__(self, target: Any, run: Callable[[Any], Any]) -> None:
        self._target, self._run = target, run

    def __getattr__(self, name: str) -> Any:
        twin = getattr(self._target, "a" + name, None)
        if twin is None:
            return getattr(self._target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = self._run(twin(*args, **kwargs))
            if result is self._target:
                return self
            if isinstance(result, budgets.Hold | client.AsyncRemoteHold):
                return Awaited(result, self._run)
            return result

        return call


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class Portal:
    """An event loop in its own thread, for the async client (its connections belong to one
    loop); ``run`` waits for an awaitable there."""

    def __init__(self) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, awaitable: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop).result(60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def scenario(api: Any, tenant: str) -> list[tuple[str, Any]]:
    """What a caller sees, step by step, normalised only where the two must differ (ids,
    times, who tripped a switch)."""
    seen: list[tuple[str, Any]] = []

    def look(step: str, value: Any) -> None:
        seen.append((step, value))

    def refusal(exc: exceptions.BudgetError) -> dict[str, Any]:
        fields = {wire.attr: getattr(exc, wire.attr) for wire in type(exc).wire}
        for name in ("budget_id", "switch_id", "tripped_by", "tripped_at", "resets_at"):
            if name in fields:
                fields[name] = type(fields[name]).__name__
        return {"class": type(exc).__name__, "message": type(exc.message).__name__, **fields}

    call = {"provider": FAKE_PROVIDER, "model": FAKE_MODEL, "input_tokens": 0}
    hold = api.reserve(tenant=tenant, end_user="u-1", max_output_tokens=1000, **call)
    look(
        "reserve",
        {
            name: (getattr(hold, name), type(getattr(hold, name)).__name__)
            for name in ("amount", "currency", "state", "model", "requested_model")
        }
        | {"max_output_tokens": hold.max_output_tokens, "degraded": hold.degraded},
    )
    before = hold.expires_at
    assert isinstance(before, datetime)
    extended = hold.extend(ttl=3600)
    look("extend", (extended is hold, hold.expires_at > before, hold.state))
    result = hold.commit(input_tokens=0, output_tokens=100)
    committed = dataclasses.asdict(result)
    assert committed.pop("reservation_id") == hold.id
    look("commit", {k: (v, type(v).__name__) for k, v in committed.items()})
    look("commit again", hold.commit(input_tokens=0, output_tokens=100).cost)
    again = api.get(hold.id)
    look("get", (again.state, again.amount, again.requested_model))

    holds = [api.reserve(tenant=tenant, max_output_tokens=1000, **call) for _ in range(3)]
    with pytest.raises(exceptions.BudgetExceeded) as exceeded:
        api.reserve(tenant=tenant, end_user="u-1", max_output_tokens=1000, **call)
    look("exceeded", refusal(exceeded.value))
    look("release", holds[0].release())
    look("release by id", api.release(holds[1].id))
    look("uncertain by id", api.mark_uncertain(holds[2].id))

    budget = Budget.objects.get(tenant__external_id=tenant)
    budget_raise_grant(
        budget=budget, amount=Decimal(5), until=timezone.now() + timedelta(hours=1), reason="t"
    )
    statuses = api.status(tenant=tenant, end_user="u-1")
    look(
        "status",
        [
            {
                f.name: type(getattr(s, f.name)).__name__
                if f.name in ("budget_id", "period_start", "resets_at")
                else getattr(s, f.name)
                for f in dataclasses.fields(BudgetStatus)
            }
            for s in statuses
        ],
    )

    api.trip(tenant=tenant, model=FAKE_MODEL, reason="bad deploy")
    with pytest.raises(exceptions.KillSwitchActive) as switched:
        api.reserve(tenant=tenant, end_user="u-1", max_output_tokens=1000, **call)
    look("switched", refusal(switched.value))
    api.clear(tenant=tenant, model=FAKE_MODEL, reason="rolled back")
    look("cleared", api.reserve(tenant=tenant, max_output_tokens=10, **call).release())

    with pytest.raises(exceptions.InvalidUsage) as invalid:
        api.reserve(tenant=tenant, max_output_tokens=0, **call)
    look("invalid", (type(invalid.value).__name__, invalid.value.field))
    with pytest.raises(exceptions.UnknownPrice) as unknown:
        api.reserve(tenant=tenant, max_output_tokens=10, **{**call, "model": "nope"})
    look("unknown price", refusal(unknown.value))
    return [(step, _renamed(value, tenant)) for step, value in seen]


def _renamed(value: Any, tenant: str) -> Any:
    if isinstance(value, str):
        return value.replace(tenant, "<tenant>")
    if isinstance(value, dict):
        return {k: _renamed(v, tenant) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_renamed(v, tenant) for v in value)
    return value


@pytest.mark.django_db(transaction=True)
def test_the_same_scenario_gives_the_same_results_through_every_surface(
    live_server: Any,
) -> None:
    surfaces = ("here", "there", "awaited here", "awaited there")
    for tenant in surfaces:
        seed(limit="100", tenant=tenant)
    url, key = f"{live_server.url}{BASE}", new_key(None, name="ops")
    portal = Portal()
    try:
        remote = client.AsyncBudgetsClient(url, key)
        seen = {
            "here": scenario(InProcess(), "here"),
            "there": scenario(client.BudgetsClient(url, key), "there"),
            # The twins' thread-sensitive calls come back to this thread (its connection).
            "awaited here": scenario(Awaited(budgets, async_to_sync(_awaited)), "awaited here"),
            "awaited there": scenario(Awaited(remote, portal.run), "awaited there"),
        }
        portal.run(remote.aclose())
    finally:
        portal.stop()
    in_process = seen["here"]
    for surface in surfaces[1:]:
        for (step, here), (_, there) in zip(in_process, seen[surface], strict=True):
            assert here == there, (surface, step)
    # The scenario saw real values, not two empty shapes.
    steps = dict(in_process)
    assert steps["commit"]["cost"] == (Decimal(3), "Decimal")
    assert steps["exceeded"]["remaining"] == Decimal(7)  # 100 - 3 spent - 3 x 30 held
    assert steps["switched"]["model"] == FAKE_MODEL
    assert steps["status"][0]["reserved"] == Decimal(30)
    assert steps["status"][0]["raised"] == Decimal(5)
    assert steps["status"][0]["limit"] == Decimal(105)


# The error wire format: ``exceptions.Wire`` is the one definition; the body, the schema and the
# client derive from it.


def every_error_class() -> list[type[exceptions.BudgetError]]:
    found, pending = [], [exceptions.BudgetError]
    while pending:
        cls = pending.pop(0)
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == "llm_budgets.exceptions"]


@pytest.mark.django_db
def test_the_schema_documents_every_attribute_errors_send() -> None:
    from django.test import Client

    schema = Client().get(f"{BASE}schema/", {"format": "json"}).json()["components"]["schemas"]
    top = set(schema["ErrorDetail"]["properties"])
    nested = set(schema["BudgetRefusal"]["properties"])
    for cls in every_error_class():
        for wire in cls.wire:
            if len(wire.where) == 1:
                assert wire.attr in top, (cls.__name__, wire.attr)
            else:
                assert wire.where[1] in nested, (cls.__name__, wire.attr)
    assert {"code", "message", "fields"} <= top


def test_every_error_declares_what_it_sends() -> None:
    """Each error's context (what it carries for the REST layer and logs) is sent by its wire,
    so no attribute travels by a second, undeclared path."""
    samples = {
        exceptions.UnknownPrice: {"provider": "p", "model": "m"},
        exceptions.InvalidUsage: {"message": "bad", "field": "x"},
        exceptions.ReservationStateError: {"message": "no", "state": "held"},
        exceptions.LedgerUnavailable: {"message": "down", "retry_after": 2},
    }
    for cls, kwargs in samples.items():
        exc = cls(**kwargs)  # type: ignore[arg-type]
        assert set(exc.context) <= {wire.attr for wire in cls.wire}, cls


# -- error codes ------------------------------------------------------------------------------

API_PACKAGE = Path(__file__).resolve().parent.parent / "llm_budgets" / "api"


def _codes_in_source(path: Path) -> set[str]:
    """String codes a module of the REST API gives errors: ``code="..."`` in a call (DRF's
    exceptions, HttpError) and ``code = "..."`` / ``default_code = "..."`` in a class body (e.g. a
    permission's). A serializer's ``ValidationError(code=...)`` never reaches the wire: the
    handler sends every validation error as ``invalid``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "ValidationError":
                continue
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    found.add(str(keyword.value.value))
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)
                    and any(
                        isinstance(t, ast.Name) and t.id in ("code", "default_code")
                        for t in statement.targets
                    )
                ):
                    found.add(statement.value.value)
    return found


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def server_error_codes() -> dict[str, str]:
    """Every ``error.code`` the REST API can send, with where it comes from."""
    from rest_framework import exceptions as drf

    import llm_budgets.api.urls  # noqa: F401  (every view, and every error they can raise)
    from llm_budgets.api.exceptions import STATUS_BY_CODE

    codes: dict[str, str] = {}
    for path in sorted(API_PACKAGE.glob("*.py")):
        codes.update(dict.fromkeys(_codes_in_source(path), path.name))
    for cls in _subclasses(drf.APIException):  # the handler sends their default codes
        if cls.__module__ == drf.__name__ and cls is not drf.ValidationError:
            codes[str(cls.default_code)] = f"rest_framework {cls.__name__}"
    codes["error"] = "rest_framework APIException"
    codes.update(dict.fromkeys(STATUS_BY_CODE, "STATUS_BY_CODE"))
    for cls in [exceptions.BudgetError, *_subclasses(exceptions.BudgetError)]:
        if (
            "code" in cls.__dict__
            and cls.__module__.startswith("llm_budgets.")
            and (cls is not client.ApiError)
        ):
            codes[cls.__dict__["code"]] = f"{cls.__module__}.{cls.__name__}"
    return codes


# Codes that never reach the REST API: raised in-process by the SDK guards only.
IN_PROCESS_ONLY_CODES = {"not_guarded"}

# What a client process alone (no Django, no server modules imported) makes of each code.
CLIENT_PROBE = """
import json, sys
from llm_budgets import client
codes = json.loads(sys.stdin.read())
print(json.dumps({
    code: (client._error_class(code) or client.ApiError).__name__
    if client._error_class(code) is not None or code in client.API_ERROR_CODES else None
    for code in codes
}))
"""


def test_the_client_knows_every_error_code_the_server_sends() -> None:
    """Each code maps, in a process that imports only the client, to the exception class that
    says it or to ``ApiError`` with a documented meaning (``client.API_ERROR_CODES``). A new
    server code fails here until the client learns it."""
    codes = {
        code: origin
        for code, origin in server_error_codes().items()
        if code not in IN_PROCESS_ONLY_CODES
    }
    # The scan sees the codes it must (a scan that found nothing would pass anything).
    assert {"malformed_api_key", "run_closed", "request_too_large", "throttled"} <= set(codes)
    probe = subprocess.run(
        [sys.executable, "-c", CLIENT_PROBE],
        input=json.dumps(sorted(codes)),
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(API_PACKAGE.parent.parent)},
    )
    mapped = json.loads(probe.stdout)
    unknown = {code: codes[code] for code, cls in mapped.items() if cls is None}
    assert unknown == {}, f"codes the client cannot map (add to client.API_ERROR_CODES): {unknown}"
    for code, cls in mapped.items():
        own_class = client._error_class(code)
        assert cls == (own_class.__name__ if own_class else "ApiError"), code
    # Each class code maps to its own class, and no ApiError code shadows one.
    assert not set(client.API_ERROR_CODES) & {
        c.__dict__.get("code") for c in _subclasses(exceptions.BudgetError)
    }
    assert set(codes) >= client.RETRYABLE_CODES


def test_the_client_table_lists_no_code_the_server_cannot_send() -> None:
    stale = set(client.API_ERROR_CODES) - set(server_error_codes()) - {"http_error"}
    assert stale == set(), "codes the server no longer sends: drop them from API_ERROR_CODES"


def test_an_unknown_code_is_an_api_error_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1/api/llm-budgets/v1/reservations")
    body = {"error": {"code": "brand_new", "message": "From a newer server."}}
    with caplog.at_level("WARNING", logger="llm_budgets.client"):
        error = client.error_from_response(httpx.Response(409, json=body, request=request))
    assert isinstance(error, client.ApiError)
    assert (error.code, error.status_code, error.message) == (
        "brand_new",
        409,
        body["error"]["message"],
    )
    assert "unknown error code 'brand_new'" in caplog.text
