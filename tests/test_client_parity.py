"""``llm_budgets.client`` works like the in-process API (issue #10, item 2): the same methods
with the same parameters, the same attributes, the same exception fields and the same return
types, checked by introspection and by running one scenario through both surfaces against a
live server."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets import budgets, client, exceptions, selectors
from llm_budgets.budget_raises import budget_raise_grant
from llm_budgets.engine.settlement import CommitResult
from llm_budgets.models import Budget
from tests.api import BASE, new_key
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


# Deliberate differences, each with its reason; anything else must match.
HOLD_ONLY_IN_PROCESS = {"reservation"}  # the model instance itself
HOLD_ONLY_REMOTE = {"data"}  # the reservation as the API last returned it
# Functions of the in-process API that are not operations of the REST API: configuration and
# operations a host runs in its own process (the REST API is for calls and kill switches).
ONLY_IN_PROCESS = {"ensure_tenant", "explain", "set_limit", "set_price", "sweep"}
# Classes the in-process API exports that are not functions.
EXPORTED_TYPES = {"CommitResult", "Hold", "Quote", "Usage"}
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
    assert public(budgets.Hold) - HOLD_ONLY_IN_PROCESS == public(client.RemoteHold) - (
        HOLD_ONLY_REMOTE
    )
    for name in public(budgets.Hold) - HOLD_ONLY_IN_PROCESS:
        here, there = getattr(budgets.Hold, name), getattr(client.RemoteHold, name)
        assert isinstance(here, property) == isinstance(there, property), name
        if callable(here):
            assert parameters(here) == parameters(there), name


def test_the_client_has_every_function_of_the_in_process_api() -> None:
    functions = set(budgets.__all__) - EXPORTED_TYPES - ONLY_IN_PROCESS
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


@pytest.mark.parametrize(
    ("here", "there"),
    [
        (CommitResult, client.RemoteCommitResult),
        (selectors.BudgetStatus, client.RemoteBudgetStatus),
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
    extended = hold.extend(ttl_seconds=3600)
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
                for f in dataclasses.fields(selectors.BudgetStatus)
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
def test_the_same_scenario_gives_the_same_results_through_both(live_server: Any) -> None:
    seed(limit="100", tenant="here")
    seed(limit="100", tenant="there")
    remote = client.BudgetsClient(f"{live_server.url}{BASE}", new_key(None, name="ops"))
    in_process = scenario(InProcess(), "here")
    over_http = scenario(remote, "there")
    for (step, here), (_, there) in zip(in_process, over_http, strict=True):
        assert here == there, step
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
