"""REST API and pricing (issue 6 with issue 3): messages / prompt counted by the server on
reserve, and commit usage in the public convention (cache reads and writes, reasoning, tools)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from llm_budgets import budgets
from llm_budgets.models import Counter, Reservation, UsageRecord
from llm_budgets.pricing.tokens import count_input_tokens
from tests.api import BASE, client_for, new_key

pytestmark = pytest.mark.django_db

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Price this, please."}]},
]


@pytest.fixture
def acme() -> Any:
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok="2.5",
        output_per_mtok="10",
        cached_input_per_mtok="1.25",
    )
    budgets.set_price(
        provider="anthropic",
        model="claude-x",
        input_per_mtok="3",
        output_per_mtok="15",
        cached_input_per_mtok="0.3",
        cache_write_per_mtok="3.75",
        cache_write_1h_per_mtok="6",
        reasoning_per_mtok="20",
        tool_fees={"web_search": "0.01"},
    )
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    return client_for(new_key("acme"))


def reserve(client: Any, **body: Any) -> Any:
    body = {"max_output_tokens": 100, **body}
    return client.post(f"{BASE}reservations", body, format="json")


@pytest.mark.parametrize(
    ("provider", "model", "text"),
    [
        ("openai", "gpt-4o", {"messages": MESSAGES}),
        ("openai", "gpt-4o", {"prompt": "  Price this, please.\n"}),
        ("anthropic", "claude-x", {"messages": MESSAGES}),
        ("anthropic", "claude-x", {"prompt": "Price this, please."}),
    ],
)
def test_the_server_counts_messages_and_prompts(
    acme: Any, provider: str, model: str, text: dict[str, Any]
) -> None:
    response = reserve(acme, provider=provider, model=model, **text)
    assert response.status_code == 201, response.content
    expected = count_input_tokens(provider=provider, model=model, **text)
    assert response.json()["input_tokens"] == expected > 0
    # The hold is what reserving the counted tokens in-process holds.
    same = budgets.reserve(
        tenant="acme", provider=provider, model=model, input_tokens=expected, max_output_tokens=100
    )
    assert Decimal(response.json()["amount"]) == same.amount


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_tokens": 5, "prompt": "hi"}, "input_tokens"),  # both: which one to believe?
        ({}, "input_tokens"),  # neither
        ({"messages": MESSAGES, "prompt": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages.0"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"prompt": 12}, "prompt"),
        ({"input_tokens": 0, "max_tool_calls": {"web_search": -1}}, "max_tool_calls.web_search"),
    ],
)
def test_bad_token_sources_are_a_400_naming_the_field(
    acme: Any, body: dict[str, Any], field: str
) -> None:
    response = reserve(acme, provider="openai", model="gpt-4o", **body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert Reservation.objects.count() == 0
    assert not Counter.objects.filter(reserved__gt=0).exists()


def test_max_tool_calls_puts_tool_fees_in_the_hold(acme: Any) -> None:
    plain = reserve(acme, model="claude-x", input_tokens=0)
    tools = reserve(acme, model="claude-x", input_tokens=0, max_tool_calls={"web_search": 3})
    assert tools.status_code == 201, tools.content
    assert Decimal(tools.json()["amount"]) - Decimal(plain.json()["amount"]) == Decimal("0.03")


def test_commit_takes_every_usage_field_in_the_public_convention(acme: Any) -> None:
    hold = reserve(
        acme,
        model="claude-x",
        input_tokens=10_000,
        max_output_tokens=1_000,
        max_tool_calls={"web_search": 2},  # a commit may report no more than it held
    ).json()
    usage = {
        "input_tokens": 10_000,  # cache reads and writes included
        "cached_input_tokens": 6_000,
        "cache_write_tokens": 2_000,
        "cache_write_1h_tokens": 500,
        "output_tokens": 300,  # reasoning included
        "reasoning_tokens": 100,
        "tool_calls": {"web_search": 2},
    }
    response = acme.post(f"{BASE}reservations/{hold['id']}/commit", usage, format="json")
    assert response.status_code == 200, response.content
    # 2000*3 + 6000*0.3 + 1500*3.75 + 500*6 + 200*15 + 100*20 per million, plus 2 searches
    expected = Decimal(6000 + 1800 + 5625 + 3000 + 3000 + 2000) / 1_000_000 + Decimal("0.02")
    body = response.json()
    assert Decimal(body["cost"]) == expected
    assert (body["pricing_basis"], Decimal(body["customer_cost"])) == ("price", expected)
    line = UsageRecord.objects.get()
    assert {name: getattr(line, name) for name in usage} == usage


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"cached_input_tokens": 8, "cache_write_tokens": 3}, "cached_input_tokens"),
        ({"cache_write_tokens": 1, "cache_write_1h_tokens": 2}, "cache_write_1h_tokens"),
        ({"reasoning_tokens": 6}, "reasoning_tokens"),
        ({"tool_calls": {"": 1}}, "tool_calls"),
    ],
)
def test_commit_usage_whose_parts_exceed_their_totals_is_a_400(
    acme: Any, usage: dict[str, Any], field: str
) -> None:
    hold = reserve(acme, model="claude-x", input_tokens=10).json()
    body = {"input_tokens": 10, "output_tokens": 5, **usage}
    response = acme.post(f"{BASE}reservations/{hold['id']}/commit", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert Reservation.objects.get().state == "held"
    assert UsageRecord.objects.count() == 0
