"""Budgets per API key, run and tag over REST and through the Python client (issue #16)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from llm_budgets import budgets
from llm_budgets.client import BudgetsClient
from llm_budgets.exceptions import BudgetExceeded, RunClosed
from llm_budgets.models import ApiKey, Budget, Scope
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed


def _prefix(key: str) -> str:
    return key.split(".", 1)[0]


@pytest.mark.django_db
def test_an_api_keys_budget_applies_to_every_call_made_with_it() -> None:
    seed(limit="1000")
    key, other = new_key("acme"), new_key("acme")
    budgets.set_limit(tenant="acme", api_key=_prefix(key), amount=Decimal("30"), window="day")
    api = client_for(key)
    assert api.post(f"{BASE}reservations", reserve_body(), format="json").status_code == 201
    refused = api.post(f"{BASE}reservations", reserve_body(), format="json")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["budget"]["scope"] == f"API key {_prefix(key)}"
    assert f"API key {_prefix(key)}" in error["message"]
    # Another key of the same tenant is not limited by it.
    second = client_for(other).post(f"{BASE}reservations", reserve_body(), format="json")
    assert second.status_code == 201


@pytest.mark.django_db
def test_run_on_reserve_and_close_over_rest() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("60"), window="lifetime")
    api = client_for(new_key("acme"))
    for _ in range(2):
        ok = api.post(f"{BASE}reservations", reserve_body(run="run-42"), format="json")
        assert ok.status_code == 201, ok.json()
    refused = api.post(f"{BASE}reservations", reserve_body(run="run-42"), format="json")
    assert refused.status_code == 429
    assert refused.json()["error"]["budget"]["scope"] == "run run-42 of acme"
    closed = api.post(f"{BASE}runs/close", {"run": "run-9", "reason": "done"}, format="json")
    assert closed.status_code == 200, closed.json()
    assert closed.json()["run"] == "run-9"
    after = api.post(f"{BASE}reservations", reserve_body(run="run-9"), format="json")
    assert after.status_code == 409
    assert after.json()["error"]["code"] == "run_closed"
    assert after.json()["error"]["run"] == "run-9"


@pytest.mark.django_db
def test_a_tenant_key_cannot_close_another_tenants_run() -> None:
    seed(limit="1000")
    seed(limit="1000", tenant="beta")
    api = client_for(new_key("acme"))
    response = api.post(f"{BASE}runs/close", {"tenant": "beta", "run": "r"}, format="json")
    assert response.status_code == 404


@pytest.mark.django_db
def test_tag_budget_and_status_over_rest() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=Decimal("40"), window="month")
    api = client_for(new_key("acme"))
    body = reserve_body(tags={"project": "alpha"})
    assert api.post(f"{BASE}reservations", body, format="json").status_code == 201
    refused = api.post(f"{BASE}reservations", body, format="json")
    assert refused.status_code == 429
    assert refused.json()["error"]["budget"]["scope"] == "tag project=alpha of acme"
    status = api.get(f"{BASE}tenants/acme/status", {"tags": '{"project": "alpha"}'})
    labels = {b["scope_label"]: b["reserved"] for b in status.json()["budgets"]}
    assert labels == {"tenant acme": "30", "tag project=alpha of acme": "30"}
    bad = api.get(f"{BASE}tenants/acme/status", {"tags": "not json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "tags"


@pytest.mark.django_db
def test_the_budgets_endpoint_accepts_the_new_scopes() -> None:
    seed(limit="1000")
    tenant_key = new_key("acme")
    operator = client_for(new_key())
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"api_key": _prefix(tenant_key)}, Scope.API_KEY, f"API key {_prefix(tenant_key)}"),
        ({"api_key": "*"}, Scope.API_KEY_DEFAULT, "API key * of acme"),
        ({"run": "*"}, Scope.RUN_DEFAULT, "run * of acme"),
        ({"run": "run-1"}, Scope.RUN, "run run-1 of acme"),
        ({"tag": ["project", "alpha"]}, Scope.TAG, "tag project=alpha of acme"),
    ]
    for scope, name, label in cases:
        body = {"tenant": "acme", "window": "day", "amount": "5", **scope}
        response = operator.post(f"{BASE}budgets", body, format="json")
        assert response.status_code == 200, response.json()
        assert (response.json()["scope"], response.json()["scope_label"]) == (name, label)
    listed = operator.get(f"{BASE}budgets", {"tenant": "acme"}).json()["results"]
    tag = [b for b in listed if b["scope"] == Scope.TAG]
    assert tag[0]["tag"] == {"project": "alpha"}
    two = {"tenant": "acme", "window": "day", "amount": "5", "run": "*", "tag": ["a", "b"]}
    assert operator.post(f"{BASE}budgets", two, format="json").status_code == 400
    assert Budget.objects.filter(scope=Scope.API_KEY).get().api_key == ApiKey.objects.get(
        prefix=_prefix(tenant_key)
    )


@pytest.mark.django_db(transaction=True)
def test_the_client_names_runs_tags_and_closes_runs(live_server: Any) -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("30"), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=Decimal("60"), window="month")
    client = BudgetsClient(f"{live_server.url}{BASE}", new_key("acme"))
    call = {
        "provider": FAKE_PROVIDER,
        "model": FAKE_MODEL,
        "input_tokens": 0,
        "max_output_tokens": 1000,
    }
    client.reserve(**call, run="run-42", tags={"project": "alpha"})
    with pytest.raises(BudgetExceeded) as refused:
        client.reserve(**call, run="run-42", tags={"project": "alpha"})
    assert refused.value.scope == "run run-42 of acme"
    labels = {
        s.scope_label for s in client.status(tenant="acme", run="run-42", tags={"project": "alpha"})
    }
    assert labels == {"tenant acme", "run run-42 of acme", "tag project=alpha of acme"}
    quote = client.quote(**call, run="run-42", tags={"project": "alpha"})
    assert {d["scope_label"] for d in quote.budgets} == labels
    closed_run = client.close_run(run="run-42")
    assert (closed_run.tenant, closed_run.run) == ("acme", "run-42")
    closed_at = closed_run.closed_at
    with pytest.raises(RunClosed) as closed:
        client.reserve(**call, run="run-42")
    assert closed.value.closed_at == closed_at
