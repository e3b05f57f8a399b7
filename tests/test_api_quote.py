"""GET /quote: the itemised worst case, the price version (or policy) and each budget the request
would draw on, over HTTP, holding nothing."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from llm_budgets import budgets
from llm_budgets.models import AuditEvent, Counter, EndUser, Plan, Price, Reservation
from llm_budgets.pricing.tokens import count_input_tokens
from tests.api import BASE, client_for, new_key
from tests.factories import seed

pytestmark = pytest.mark.django_db


def rows() -> tuple[int, int, int, int]:
    return (
        Reservation.objects.count(),
        Counter.objects.count(),
        EndUser.objects.count(),
        AuditEvent.objects.count(),
    )


def quote(client: Any, **params: Any) -> Any:
    return client.get(f"{BASE}quote", params)


@pytest.fixture
def acme() -> Any:
    budgets.set_price(
        provider="anthropic",
        model="claude-x",
        input_per_mtok="3",
        output_per_mtok="15",
        cache_write_per_mtok="3.75",
        per_request="0.001",
        tool_fees={"web_search": "0.01"},
    )
    Plan.objects.create(name="pro", markup_percent=Decimal(25))
    budgets.ensure_tenant(tenant="acme", plan="pro")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("0.01"), window="day")
    budgets.set_limit(amount=Decimal(1000), window="month", unit="customer_price")
    return client_for(new_key("acme"))


def test_quote_itemises_the_worst_case_and_holds_nothing(acme: Any) -> None:
    before = rows()
    response = quote(
        acme, model="claude-x", input_tokens=1000, max_output_tokens=2000, end_user="new-user"
    )
    assert response.status_code == 200, response.content
    assert rows() == before  # no hold, no counter, no end user, no audit
    body = response.json()
    assert (body["tenant"], body["end_user"], body["provider"]) == ("acme", "new-user", "anthropic")
    assert (body["input_tokens"], body["max_output_tokens"]) == (1000, 2000)
    assert body["pricing_basis"] == "price"
    assert body["price"]["id"] == Price.objects.get(model="claude-x").pk
    assert [tuple(item.values()) for item in body["items"]] == [
        ("cache_write_per_mtok", 1000, "3.75", "0.00375"),
        ("input_tolerance", 356, "3.75", "0.001335"),
        ("output_per_mtok", 2000, "15", "0.03"),
        ("per_request", 1, "0.001", "0.001"),
    ]
    assert set(body["items"][0]) == {"dimension", "quantity", "rate", "amount"}
    assert (body["amount"], body["markup_percent"], body["customer_amount"]) == (
        "0.036085",
        "25",
        "0.04510625",
    )
    assert (body["input_tolerance"], body["customer_input_tolerance"]) == ("0.001335", "0.00166875")
    assert body["currency"] == "USD"
    draws = {(d["budget"]["scope_label"], d["budget"]["window"]): d for d in body["budgets"]}
    assert draws[("tenant acme", "month")]["fits"] is True
    assert draws[("tenant acme", "month")]["would_hold"] == "0.036085"
    assert draws[("end user acme/*", "day")]["fits"] is False  # 0.036085 > 0.01
    assert ("global", "month") not in draws  # every tenant's spend: not a tenant key's to see
    assert body["admissible"] is False
    operator = quote(
        client_for(new_key(None)),
        tenant="acme",
        model="claude-x",
        input_tokens=1000,
        max_output_tokens=2000,
    ).json()
    shared = next(d for d in operator["budgets"] if d["budget"]["scope"] == "global")
    assert shared["would_hold"] == "0.04510625"  # customer price
    assert shared["budget"]["unit"] == "customer_price"


def test_quote_counts_messages_and_prompts(acme: Any) -> None:
    messages = [{"role": "user", "content": "How much is this?"}]
    counted = count_input_tokens(provider="anthropic", model="claude-x", messages=messages)
    by_messages = quote(acme, model="claude-x", messages=json.dumps(messages), max_output_tokens=1)
    assert by_messages.status_code == 200, by_messages.content
    assert by_messages.json()["input_tokens"] == counted
    by_prompt = quote(acme, model="claude-x", prompt="How much is this?", max_output_tokens=1)
    assert by_prompt.json()["input_tokens"] == count_input_tokens(
        provider="anthropic", model="claude-x", prompt="How much is this?"
    )


def test_quote_with_tool_calls_and_without_an_end_user(acme: Any) -> None:
    response = quote(
        acme,
        model="claude-x",
        input_tokens=0,
        max_output_tokens=1,
        max_tool_calls='{"web_search": 2}',
    )
    assert response.status_code == 200, response.content
    body = response.json()
    tool = {"dimension": "tool:web_search", "quantity": 2, "rate": "0.01", "amount": "0.02"}
    assert tool in body["items"], body["items"]
    assert body["end_user"] is None
    assert {d["budget"]["scope"] for d in body["budgets"]} == {"tenant"}  # global: not shown
    assert body["admissible"] is True


def test_quote_explains_a_policy_price() -> None:
    Plan.objects.create(
        name="fixed",
        unknown_model_policy="reserve_fixed",
        unknown_model_fixed_amount=Decimal("0.2"),
        default_max_output_tokens=100,
    )
    budgets.ensure_tenant(tenant="acme", plan="fixed")
    budgets.set_limit(tenant="acme", amount=Decimal(1), window="month")
    response = quote(client_for(new_key("acme")), provider="p", model="mystery", input_tokens=5)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["price"], body["pricing_basis"], body["amount"]) == (None, "fixed", "0.2")
    assert body["max_output_tokens"] == 100
    assert body["admissible"] is True


def test_an_operator_key_names_the_tenant() -> None:
    seed()
    operator = client_for(new_key(None))
    response = quote(operator, provider="fake", model="m30", input_tokens=0, max_output_tokens=1000)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "tenant"
    response = quote(
        operator,
        tenant="acme",
        provider="fake",
        model="m30",
        input_tokens=0,
        max_output_tokens=1000,
    )
    assert response.status_code == 200, response.content
    assert (response.json()["tenant"], response.json()["amount"]) == ("acme", "30")


GOOD = {"model": "claude-x", "input_tokens": 0, "max_output_tokens": 1}
DROP = None  # an override that leaves the parameter out


@pytest.mark.parametrize(
    ("overrides", "status", "code", "field"),
    [
        ({"max_output_tokens": DROP}, 422, "output_ceiling_required", None),
        ({"model": "nope"}, 422, "unknown_price", None),
        ({"input_tokens": DROP}, 400, "invalid", "input_tokens"),
        ({"prompt": "x"}, 400, "invalid", "input_tokens"),  # both: which one to believe?
        ({"input_tokens": DROP, "messages": "[not json"}, 400, "invalid", "messages"),
        ({"input_tokens": DROP, "messages": '{"role": "user"}'}, 400, "invalid", "messages"),
        ({"max_tool_calls": "[]"}, 400, "invalid", "max_tool_calls"),
        ({"input_tokens": -1}, 400, "invalid", "input_tokens"),
        ({"max_output_token": 1}, 400, "invalid", "max_output_token"),
        ({"model": DROP}, 400, "invalid", "model"),
        ({"ttl_seconds": 0}, 400, "invalid", "ttl_seconds"),
    ],
)
def test_quote_errors(
    acme: Any, overrides: dict[str, Any], status: int, code: str, field: str | None
) -> None:
    params = {k: v for k, v in {**GOOD, **overrides}.items() if v is not DROP}
    before = rows()
    response = quote(acme, **params)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    if field is not None:
        assert field in error["fields"], error
    assert rows() == before


def test_quote_needs_a_key(acme: Any) -> None:
    response = quote(client_for(None), model="claude-x", input_tokens=0, max_output_tokens=1)
    assert response.status_code == 401


def test_quote_says_which_rule_priced_the_model_name(acme: Any) -> None:
    budgets.set_price(provider="openai", model="gpt-4o", input_per_mtok="2.5", output_per_mtok="10")
    exact = quote(acme, model="claude-x", input_tokens=10, max_output_tokens=10).json()
    assert exact["model_match"] == {"rule": "exact", "model": "claude-x", "detail": ""}
    dated = quote(
        acme, provider="openai", model="gpt-4o-2024-08-06", input_tokens=10, max_output_tokens=10
    ).json()
    assert (dated["model"], dated["price"]["model"]) == ("gpt-4o-2024-08-06", "gpt-4o")
    assert dated["model_match"]["rule"] == "genai-prices"
    assert dated["model_match"]["model"] == "gpt-4o"
