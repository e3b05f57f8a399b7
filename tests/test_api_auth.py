"""REST API: keys (hashed, shown once, revocable, expiring, scoped), throttling, and the
operator-only and read-only endpoints."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from llm_budgets.checks import check_settings
from llm_budgets.control.api_keys import api_key_create, api_key_revoke
from llm_budgets.models import ApiKey, AuditEvent, Budget, EndUser, Scope
from tests.api import BASE, client_for, new_key
from tests.factories import seed

pytestmark = pytest.mark.django_db


def status_of(client: Any, tenant: str = "acme") -> Any:
    return client.get(f"{BASE}tenants/{tenant}/status")


def test_keys_are_hashed_at_rest_with_a_visible_prefix() -> None:
    seed()
    api_key, key = api_key_create(tenant="acme", name="backend")
    prefix, _, secret = key.partition(".")
    assert api_key.prefix == prefix
    stored = ApiKey.objects.get(pk=api_key.pk)
    assert secret not in stored.hashed_key
    assert key not in stored.pk
    assert stored.hashed_key.startswith("sha512$$")
    assert AuditEvent.objects.filter(action="api_key.create", target__contains=prefix).exists()


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "not_authenticated"),
        ("Bearer abc", "malformed_api_key"),
        ("Api-Key nodot", "malformed_api_key"),
        ("Api-Key abcdefgh.wrong", "invalid_api_key"),
    ],
)
def test_missing_or_bad_keys_are_401(header: str | None, code: str) -> None:
    seed()
    new_key("acme")
    client = client_for(None)
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = status_of(client)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == code
    assert response["WWW-Authenticate"] == "Api-Key"


def test_a_key_with_a_wrong_secret_is_401() -> None:
    seed()
    key = new_key("acme")
    prefix = key.partition(".")[0]
    response = status_of(client_for(f"{prefix}.{'x' * 32}"))
    assert response.status_code == 401
    assert status_of(client_for(key)).status_code == 200


def test_a_revoked_key_is_401() -> None:
    seed()
    api_key, key = api_key_create(tenant="acme", name="old")
    api_key_revoke(api_key, actor="test", reason="leaked")
    response = status_of(client_for(key))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "api_key_revoked"


def test_an_expired_key_is_401() -> None:
    seed()
    key = new_key("acme", expires_at=timezone.now() + timedelta(days=1))
    assert status_of(client_for(key)).status_code == 200
    with time_machine.travel(timezone.now() + timedelta(days=2)):
        response = status_of(client_for(key))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "api_key_expired"


def test_status_shows_every_budget_that_applies() -> None:
    seed(limit="100")
    client = client_for(new_key("acme"))
    client.post(
        f"{BASE}reservations",
        {"provider": "fake", "model": "m30", "input_tokens": 0, "max_output_tokens": 1000},
        format="json",
    )
    response = status_of(client)
    assert response.status_code == 200
    body = response.json()
    assert body["tenant"] == "acme"
    assert body["end_user"] is None
    [budget] = body["budgets"]
    assert (budget["limit"], budget["reserved"], budget["remaining"]) == ("100", "30", "70")
    assert budget["scope_label"] == "tenant acme"
    assert budget["resets_at"]


def test_status_for_one_end_user_includes_its_defaults_without_creating_it() -> None:
    from llm_budgets import budgets

    seed(limit="100")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(5), window="day")
    client = client_for(new_key("acme"))
    response = client.get(f"{BASE}tenants/acme/status", {"end_user": "u-9"})
    assert response.status_code == 200
    assert response.json()["end_user"] == "u-9"
    assert {b["window"] for b in response.json()["budgets"]} == {"month", "day"}
    assert not EndUser.objects.exists()


def test_budgets_need_an_operator_key() -> None:
    seed()
    tenant_client = client_for(new_key("acme"))
    listed = tenant_client.get(f"{BASE}budgets")
    assert listed.status_code == 403
    assert listed.json()["error"]["code"] == "operator_key_required"
    changed = tenant_client.post(
        f"{BASE}budgets", {"tenant": "acme", "window": "month", "amount": "1000"}, format="json"
    )
    assert changed.status_code == 403
    assert Budget.objects.get().limit == Decimal(100)


def test_an_operator_lists_and_sets_limits_with_an_audit_trail() -> None:
    seed()
    operator = client_for(new_key(None, name="ops"))
    listed = operator.get(f"{BASE}budgets", {"tenant": "acme"})
    assert listed.status_code == 200
    assert listed.json()["count"] == 1
    assert listed.json()["results"][0]["limit"] == "100"
    response = operator.post(
        f"{BASE}budgets",
        {"tenant": "acme", "window": "month", "amount": "250.50", "reason": "upgrade"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["limit"] == "250.5"
    assert Budget.objects.get(scope=Scope.TENANT).limit == Decimal("250.50")
    event = AuditEvent.objects.get(action="budget.change_limit")
    assert event.reason == "upgrade"
    assert event.actor.startswith("api key ")
    global_cap = operator.post(f"{BASE}budgets", {"window": "day", "amount": 1000}, format="json")
    assert global_cap.status_code == 200
    assert global_cap.json()["scope"] == "global"


def test_money_is_never_a_float() -> None:
    seed()
    operator = client_for(new_key(None))
    response = operator.post(
        f"{BASE}budgets", {"tenant": "acme", "window": "month", "amount": 0.1}, format="json"
    )
    assert response.status_code == 400
    assert "float" in response.json()["error"]["fields"]["amount"][0]


def test_setting_a_limit_for_an_unknown_tenant_is_404() -> None:
    operator = client_for(new_key(None))
    response = operator.post(
        f"{BASE}budgets", {"tenant": "ghost", "window": "month", "amount": "1"}, format="json"
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_tenant"


def test_every_key_reads_prices() -> None:
    seed()
    response = client_for(new_key("acme")).get(f"{BASE}prices", {"provider": "fake"})
    assert response.status_code == 200
    [price] = response.json()["results"]
    assert (price["model"], price["output_per_mtok"], price["input_per_mtok"]) == (
        "m30",
        "30000",
        "0",
    )
    other = client_for(new_key("acme")).get(f"{BASE}prices", {"provider": "nobody"})
    assert other.json()["results"] == []


def test_each_key_is_throttled_on_its_own() -> None:
    seed()
    cache.clear()
    first, second = client_for(new_key("acme")), client_for(new_key("acme"))
    # The windows are the clock's minutes: the three requests in one, whenever the test runs.
    next_minute = timezone.now().replace(second=1, microsecond=0) + timedelta(minutes=1)
    with (
        time_machine.travel(next_minute, tick=False),
        override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "2/minute"}),
    ):
        assert [status_of(first).status_code for _ in range(2)] == [200, 200]
        throttled = status_of(first)
        assert throttled.status_code == 429
        assert throttled.json()["error"]["code"] == "throttled"
        assert 1 <= int(throttled["Retry-After"]) <= 60
        assert status_of(second).status_code == 200
    with override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": None}):
        assert status_of(first).status_code == 200


@pytest.mark.parametrize("rate", ["fast", "0/minute", 10, "10/fortnight"])
def test_a_bad_throttle_rate_fails_its_check(rate: object) -> None:
    with override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": rate}):
        assert [m.id for m in check_settings()] == ["llm_budgets.E009"]


@pytest.mark.parametrize("rate", [None, "600/minute", "5/s", "100/hour", "1000/day"])
def test_good_throttle_rates_pass_the_check(rate: object) -> None:
    with override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": rate}):
        assert check_settings() == []


def test_create_api_key_command_prints_the_key_alone_on_its_last_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed()
    call_command("llm_budgets_create_api_key", "--tenant", "acme", "--name", "backend")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert status_of(client_for(key)).status_code == 200
    assert ApiKey.objects.get(prefix=key.partition(".")[0]).tenant.external_id == "acme"  # type: ignore[union-attr]
    call_command("llm_budgets_create_api_key", "--operator")
    operator_key = capsys.readouterr().out.strip().splitlines()[-1]
    assert ApiKey.objects.get(prefix=operator_key.partition(".")[0]).is_operator
    assert client_for(operator_key).get(f"{BASE}budgets").status_code == 200


def test_create_api_key_command_refuses_an_unknown_tenant() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="ghost"):
        call_command("llm_budgets_create_api_key", "--tenant", "ghost")
