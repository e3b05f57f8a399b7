"""The prepaid balance over REST (issue 30): a tenant's key reads and tops up only its own."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.billing.credits import (
    account_of,
    balance_adjust,
    balance_open,
    credit_add,
    credits_expire,
)
from llm_budgets.billing.topups import top_up_checkout
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import TopUp
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.api import BASE, client_for, new_key
from tests.factories import reserve_30
from tests.stripe_support import fake_stripe, set_up

pytestmark = pytest.mark.django_db
__all__ = ["fake_stripe"]


def prepaid(fake: StripeServer) -> dict[str, str]:
    set_up(fake)
    budgets.ensure_tenant(tenant="globex", name="Globex")
    balance_open(tenant="acme", top_up_url="https://host.example/top-up")
    credit_add(account=account_of("acme"), amount="50", actor="t", reason="trial")
    return {"acme": new_key("acme", name="a"), "globex": new_key("globex", name="g")}


def test_the_balance_shows_credit_spent_held_and_history(fake_stripe: StripeServer) -> None:
    keys = prepaid(fake_stripe)
    reserve_30().commit(input_tokens=0, output_tokens=500)
    reserve_30()
    body = client_for(keys["acme"]).get(f"{BASE}tenants/acme/balance").json()
    assert (body["credit"], body["spent"], body["held"], body["available"]) == (
        "50",
        "15",
        "30",
        "5",
    )
    assert body["lots"][0]["amount"] == "50"
    assert body["lots"][0]["origin"] == "grant"
    assert body["top_up_url"] == "https://host.example/top-up"


def spent_past_the_credit() -> None:
    """acme's credit falls below a hold of 30 (staff remove 30, a promotional 10 expires); the
    call then commits: 10 owed."""
    now = timezone.now()
    credit_add(
        account=account_of("acme"),
        amount="10",
        kind="promotional",
        expires_at=now + timedelta(hours=1),
        actor="t",
        reason="trial",
    )
    hold = reserve_30()
    balance_adjust(tenant="acme", amount="30", direction="remove", actor="t", reason="test")
    credits_expire(now=now + timedelta(hours=2))
    hold.commit(input_tokens=0, output_tokens=1000)


def test_a_balance_spent_past_its_credit_shows_the_debt(fake_stripe: StripeServer) -> None:
    """Issue #38: the answer said available "0" and hid what was owed."""
    keys = prepaid(fake_stripe)
    spent_past_the_credit()
    body = client_for(keys["acme"]).get(f"{BASE}tenants/acme/balance").json()
    assert (body["credit"], body["spent"], body["available"], body["debt"]) == (
        "20",
        "30",
        "0",
        "10",
    )
    credit_add(account=account_of("acme"), amount="25", actor="t", reason="top-up")
    body = client_for(keys["acme"]).get(f"{BASE}tenants/acme/balance").json()
    assert (body["available"], body["debt"]) == ("15", "0")  # the debt was paid first


def test_another_tenants_key_sees_nothing_and_a_tenant_without_balance_is_told(
    fake_stripe: StripeServer,
) -> None:
    keys = prepaid(fake_stripe)
    assert client_for(keys["globex"]).get(f"{BASE}tenants/acme/balance").status_code == 404
    answer = client_for(keys["globex"]).get(f"{BASE}tenants/globex/balance")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "no_balance"


def test_a_top_up_through_the_api_starts_a_checkout(fake_stripe: StripeServer) -> None:
    keys = prepaid(fake_stripe)
    body = {
        "amount": "20",
        "success_url": "https://h.example/ok",
        "cancel_url": "https://h.example/no",
    }
    answer = client_for(keys["acme"]).post(f"{BASE}tenants/acme/top-ups", body, format="json")
    assert answer.status_code == 201, answer.json()
    session = fake_stripe.state.checkout_sessions[answer.json()["session_id"]]
    assert session["amount_total"] == 2000
    assert answer.json()["top_up"]["state"] == "pending"
    assert answer.json()["checkout_url"] == session["url"]
    denied = client_for(keys["globex"]).post(f"{BASE}tenants/acme/top-ups", body, format="json")
    assert denied.status_code == 404
    assert Decimal(account_of("acme").budget.limit) == Decimal(50)


def test_a_retried_top_up_request_returns_the_same_checkout(fake_stripe: StripeServer) -> None:
    keys = prepaid(fake_stripe)
    body = {
        "amount": "20",
        "success_url": "https://h.example/ok",
        "cancel_url": "https://h.example/no",
    }
    client = client_for(keys["acme"])
    first = client.post(
        f"{BASE}tenants/acme/top-ups", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1"
    )
    again = client.post(
        f"{BASE}tenants/acme/top-ups", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1"
    )
    assert again.json() == first.json()
    assert again.has_header("Idempotent-Replayed")
    assert len(fake_stripe.state.checkout_sessions) == 1


@pytest.mark.parametrize(
    ("amount", "says"),
    [
        ("1e3", "no sign, exponent or spaces"),
        ("1E+3", "no sign, exponent or spaces"),
        (1000.0, "not a float"),
        (20.5, "not a float"),
        ("-5", "no sign"),
        ("10000.01", "more than one top-up may pay, 10,000.00 USD"),
        ("250000", "PREPAID_TOP_UP_MAX"),
    ],
)
def test_a_top_up_amount_is_refused_as_the_page_refuses_it_with_a_field_error(
    fake_stripe: StripeServer, amount: object, says: str
) -> None:
    # The page hands the typed text to top_up_checkout, which refuses an exponent; the API's
    # serializer used to turn "1e3" and JSON floats into Decimals first, and had no maximum.
    keys = prepaid(fake_stripe)
    body = {
        "amount": amount,
        "success_url": "https://h.example/ok",
        "cancel_url": "https://h.example/no",
    }
    answer = client_for(keys["acme"]).post(f"{BASE}tenants/acme/top-ups", body, format="json")
    assert answer.status_code == 400, answer.content
    problem = answer.json()["error"]
    assert list(problem["fields"]) == ["amount"]
    assert says in problem["fields"]["amount"][0]
    assert fake_stripe.state.checkout_sessions == {}
    assert not TopUp.objects.exists()  # nothing half-written


def test_the_top_up_maximum_is_a_setting_held_by_the_service_the_page_calls_too(
    fake_stripe: StripeServer, settings: Any
) -> None:
    keys = prepaid(fake_stripe)
    body = {
        "amount": "10000",
        "success_url": "https://h.example/ok",
        "cancel_url": "https://h.example/no",
    }
    client = client_for(keys["acme"])
    assert client.post(f"{BASE}tenants/acme/top-ups", body, format="json").status_code == 201
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "PREPAID_TOP_UP_MAX": "100"}
    refused = client.post(f"{BASE}tenants/acme/top-ups", body, format="json")
    assert refused.status_code == 400
    assert "100.00 USD" in refused.json()["error"]["fields"]["amount"][0]
    with pytest.raises(InvalidUsage, match="PREPAID_TOP_UP_MAX") as raised:
        top_up_checkout(
            tenant="acme", amount="100.01", success_url="https://h/o", cancel_url="https://h/n"
        )
    assert raised.value.field == "amount"
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "PREPAID_TOP_UP_MAX": None}
    body["amount"] = "250000"
    assert client.post(f"{BASE}tenants/acme/top-ups", body, format="json").status_code == 201


def test_stripe_failing_a_top_up_is_a_503_with_retry_after_not_a_bad_request(
    fake_stripe: StripeServer,
) -> None:
    """Stripe's failure is a dependency's, not the request's (issue #38): it was a 400."""
    keys = prepaid(fake_stripe)
    fake_stripe.inject("/v1/checkout/sessions", "500")
    body = {
        "amount": "20",
        "success_url": "https://h.example/ok",
        "cancel_url": "https://h.example/no",
    }
    answer = client_for(keys["acme"]).post(f"{BASE}tenants/acme/top-ups", body, format="json")
    assert answer.status_code == 503, answer.json()
    assert answer["Retry-After"] == "10"
    error = answer.json()["error"]
    assert error["code"] == "payment_provider_error"
    assert "Nothing was charged" in error["message"]
    assert "field" not in error
