"""The public API's spellings (issue #24, item 4): one name for the TTL, ``tenant=`` as a
keyword everywhere, required reasons; the old spellings work for one release with a
``DeprecationWarning`` (an error in this suite unless a test expects it)."""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any

import httpx
import pytest

from llm_budgets import budgets, client
from llm_budgets.models import Tenant
from tests.factories import reserve_30, seed


@pytest.mark.django_db
def test_extend_takes_ttl_and_ttl_seconds_with_a_warning() -> None:
    seed()
    hold = reserve_30()
    first = hold.extend(ttl=600).expires_at
    with pytest.warns(DeprecationWarning, match=r"extend\(ttl=\.\.\.\)"):
        later = hold.extend(ttl_seconds=1200).expires_at
    assert later > first
    with pytest.warns(DeprecationWarning, match="ttl_seconds"):
        assert budgets.extend(hold.id, ttl_seconds=1800).expires_at > later
    with pytest.raises(TypeError, match="not both"):
        budgets.extend(hold.id, ttl=1, ttl_seconds=1)
    with pytest.raises(TypeError, match="'ttl'"):
        budgets.extend(hold.id)


def test_the_client_takes_ttl_and_ttl_seconds_with_a_warning() -> None:
    sent: list[bytes] = []

    def serve(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, json={"id": "00000000-0000-4000-8000-000000000001"})

    http = httpx.Client(transport=httpx.MockTransport(serve))
    remote = client.BudgetsClient("http://budgets.test/v1/", "k.s", http=http)
    remote.extend("00000000-0000-4000-8000-000000000001", ttl=60)
    with pytest.warns(DeprecationWarning, match="ttl_seconds"):
        remote.extend("00000000-0000-4000-8000-000000000001", ttl_seconds=60)
    assert sent == [b'{"ttl_seconds":60}', b'{"ttl_seconds":60}']  # the wire keeps its name


@pytest.mark.django_db
def test_ensure_tenant_takes_the_tenant_as_a_keyword() -> None:
    made = budgets.ensure_tenant(tenant="acme", name="Acme")
    assert (made.external_id, made.name) == ("acme", "Acme")
    with pytest.warns(DeprecationWarning, match=r"ensure_tenant\(tenant=\.\.\.\)"):
        again = budgets.ensure_tenant("acme", name="Acme Corp")
    assert again.id == made.id
    assert Tenant.objects.get(external_id="acme").name == "Acme Corp"
    with pytest.raises(TypeError):
        budgets.ensure_tenant("acme", tenant="acme")
    with pytest.raises(TypeError, match="'tenant'"):
        budgets.ensure_tenant(name="Nobody")


def required(function: Any, name: str) -> bool:
    return inspect.signature(function).parameters[name].default is inspect.Parameter.empty


@pytest.mark.parametrize("name", ["trip", "clear"])
def test_a_kill_switch_reason_has_no_default_to_refuse(name: str) -> None:
    assert required(getattr(budgets, name), "reason")
    assert required(getattr(client.BudgetsClient, name), "reason")


def test_one_ttl_name_in_the_public_api() -> None:
    """Every function and method of both surfaces that takes a TTL calls it ``ttl``;
    ``ttl_seconds`` is only the deprecated alias beside it."""
    surfaces: list[Any] = [
        *(getattr(budgets, name) for name in budgets.__all__),
        *(getattr(budgets.Hold, name) for name in dir(budgets.Hold) if not name.startswith("_")),
        *(getattr(client.BudgetsClient, n) for n in dir(client.BudgetsClient) if n[0] != "_"),
        *(getattr(client.RemoteHold, n) for n in dir(client.RemoteHold) if n[0] != "_"),
    ]
    for function in surfaces:
        if not inspect.isfunction(function):
            continue
        names = set(inspect.signature(function).parameters)
        if "ttl_seconds" in names:
            assert "ttl" in names, function


def _returns(function: Any) -> Any:
    """The return annotation; for a client operation written as steps (a generator the sync
    and async clients drive), what the steps return."""
    returned = inspect.get_annotations(function, eval_str=True).get("return")
    if typing.get_origin(returned) is collections.abc.Generator:
        return typing.get_args(returned)[2]
    return returned


def _plain(returned: Any, name: str) -> bool:
    """Whether ``returned`` is what a public function may return: a class of
    ``llm_budgets.results`` (or a list of them), ``HoldState``, a ``Hold``, or ``int`` for
    ``sweep`` (how many expired)."""
    from llm_budgets import results

    if typing.get_origin(returned) is list:
        return all(_plain(arg, name) for arg in typing.get_args(returned))
    if returned is budgets.Hold or returned == results.HoldState:
        return True
    if returned is int:
        return name in ("sweep", "asweep")
    return inspect.isclass(returned) and returned.__module__ == results.__name__


def test_every_public_function_returns_a_results_type() -> None:
    """Every public function returns plain data of ``llm_budgets.results`` (no model instance,
    no type of an inner module: issue 24 item 4), a hold, or a scalar typed there; the client
    returns the same classes where it has a counterpart."""
    from llm_budgets import results

    names = [n for n in budgets.__all__ if inspect.isfunction(getattr(budgets, n))]
    assert {"quote", "explain", "close_run", "aquote", "aexplain", "aclose_run"} <= set(names)
    for name in names:
        assert _plain(_returns(getattr(budgets, name)), name), (
            name,
            _returns(getattr(budgets, name)),
        )
    for name in ("trip", "clear"):
        assert _returns(getattr(budgets, name)) is results.KillSwitchResult
        assert _returns(getattr(client.BudgetsClient, name)) is results.KillSwitchResult
    for name in ("release", "mark_uncertain"):
        assert _returns(getattr(budgets, name)) == results.HoldState
        assert _returns(getattr(client.BudgetsClient, name)) == results.HoldState
    assert _returns(budgets.close_run) is results.ClosedRun
    assert _returns(client.BudgetsClient.close_run) is results.ClosedRun
    assert _returns(budgets.quote) is results.Quote
    assert _returns(budgets.explain) is results.Explanation


@pytest.mark.django_db
def test_results_read_like_the_models_they_replace_and_pk_warns() -> None:
    seed()
    switch = budgets.trip(tenant="acme", model="m", reason="runaway", actor="ops")
    assert (switch.scope, switch.tenant, switch.active, switch.reason) == (
        "tenant acme, model m",
        "acme",
        True,
        "runaway",
    )
    with pytest.warns(DeprecationWarning, match=r"read \.id, not \.pk"):
        assert switch.pk == switch.id
    cleared = budgets.clear(tenant="acme", model="m", reason="fixed")
    assert (cleared.id, cleared.active, cleared.clear_reason) == (switch.id, False, "fixed")
    budget = budgets.set_limit(tenant="acme", end_user="*", amount="5", window="day")
    assert (budget.scope_label, budget.limit, budget.window) == (
        "end user acme/*",
        5,
        "day",
    )
    tenant = budgets.ensure_tenant(tenant="acme", timezone="Asia/Tokyo")
    assert (tenant.external_id, tenant.timezone) == ("acme", "Asia/Tokyo")
    assert budgets.release(reserve_30().id) == "released"


def test_a_kill_switch_has_one_shape_in_process_and_over_rest() -> None:
    from llm_budgets.api.killswitches import KillSwitchSerializer
    from llm_budgets.results import KillSwitchResult

    assert list(KillSwitchSerializer.Meta.fields) == list(KillSwitchResult.__dataclass_fields__)
