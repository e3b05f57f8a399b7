"""Self-serve over REST (issue #29): a tenant key the operators marked ``self_serve`` does what a
tenant admin does on the pages, through the same services; other keys cannot; another tenant's
ids answer 404; every change is audited as the key."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import ApiKey, AuditEvent, Budget, BudgetRaise, Tenant
from tests.api import BASE, client_for, new_key
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def keys() -> dict[str, str]:
    seed(tenant="acme", limit="1000")
    seed(tenant="beta", limit="1000")
    Tenant.objects.update(self_serve=True, self_serve_ceiling=Decimal(100))
    found = {
        "acme": new_key("acme", name="acme-admin"),
        "beta": new_key("beta", name="beta-admin"),
        "plain": new_key("acme", name="plain"),
        "operator": new_key(None, name="ops"),
    }
    ApiKey.objects.filter(name__in=["acme-admin", "beta-admin"]).update(self_serve=True)
    return found


def post(key: str, path: str, body: dict[str, Any]) -> Any:
    return client_for(key).post(f"{BASE}self-serve/{path}", body, format="json")


def test_a_self_serve_key_caps_a_user_the_call_is_refused_then_a_raise_lets_it_pass(
    keys: dict[str, str],
) -> None:
    response = post(keys["acme"], "budgets", {"end_user": "carol", "window": "day", "amount": "20"})
    assert response.status_code == 200, response.json()
    assert response.json()["scope_label"] == "end user acme/carol"
    with pytest.raises(BudgetExceeded, match="carol"):
        reserve_30(tenant="acme", end_user="carol")
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    response = post(
        keys["acme"],
        "raises",
        {"end_user": "carol", "window": "day", "amount": "15", "until": until, "reason": "r"},
    )
    assert response.status_code == 201, response.json()
    reserve_30(tenant="acme", end_user="carol").release()
    actors = set(
        AuditEvent.objects.filter(tenant__external_id="acme").values_list("actor", flat=True)
    )
    assert any(a.endswith("(acme-admin) (tenant admin of acme)") for a in actors)


def test_above_the_ceiling_is_403_naming_the_field(keys: dict[str, str]) -> None:
    response = post(
        keys["acme"], "budgets", {"end_user": "carol", "window": "day", "amount": "101"}
    )
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "self_serve_denied"
    assert error["field"] == "amount"
    assert "100.00" in error["message"]


@pytest.mark.parametrize("who", ["plain", "operator"])
def test_keys_without_the_scope_get_403_on_every_route(keys: dict[str, str], who: str) -> None:
    for path in [
        "budgets",
        "budgets/1/remove",
        "raises",
        "raises/1/revoke",
        "end-users/reset",
        "api-keys",
        "api-keys/x/revoke",
    ]:
        response = post(keys[who], path, {})
        assert response.status_code == 403, path
        assert response.json()["error"]["code"] == "self_serve_key_required"


def test_self_serve_off_for_the_tenant_is_403_whatever_the_key(keys: dict[str, str]) -> None:
    Tenant.objects.filter(external_id="acme").update(self_serve=False)
    response = post(keys["acme"], "budgets", {"end_user": "c", "window": "day", "amount": "1"})
    assert response.status_code == 403
    assert "Self-serve is off" in response.json()["error"]["message"]


def test_another_tenants_ids_are_404_and_nothing_changes(keys: dict[str, str]) -> None:
    beta_budget = budgets.set_limit(tenant="beta", end_user="zed", amount=5, window="day")
    beta_raise = BudgetRaise.objects.create(
        budget=Budget.objects.get(pk=beta_budget.id),
        amount=1,
        starts_at=timezone.now(),
        ends_at=timezone.now() + timedelta(hours=1),
        reason="r",
    )
    beta_prefix = keys["beta"].split(".")[0]
    before = AuditEvent.objects.count()
    for path, body in [
        (f"budgets/{beta_budget.id}/remove", {}),
        (f"raises/{beta_raise.pk}/revoke", {}),
        (f"api-keys/{beta_prefix}/revoke", {}),
        ("end-users/reset", {"end_user": "zed", "reason": "r"}),
    ]:
        assert post(keys["acme"], path, body).status_code == 404, path
    response = post(
        keys["acme"], "budgets", {"api_key": beta_prefix, "window": "day", "amount": "1"}
    )
    assert response.status_code == 400
    assert AuditEvent.objects.count() == before
    assert not ApiKey.objects.get(prefix=beta_prefix).revoked


def test_a_created_key_is_the_tenants_shown_once_and_never_self_serve(keys: dict[str, str]) -> None:
    response = post(keys["acme"], "api-keys", {"name": "ci"})
    assert response.status_code == 201
    body = response.json()
    key = ApiKey.objects.get(prefix=body["prefix"])
    assert key.tenant is not None
    assert key.tenant.external_id == "acme"
    assert not key.self_serve
    assert body["key"].startswith(body["prefix"] + ".")
    assert post(keys["acme"], f"api-keys/{key.prefix}/revoke", {}).status_code == 204
    key.refresh_from_db()
    assert key.revoked
