"""Over real HTTP on a live, threaded test server: the seed race, and the Python client."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from llm_budgets import budgets
from llm_budgets.client import ApiError, BudgetsClient, RemoteHold
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    OutputCeilingRequired,
    ReservationNotFound,
    ReservationStateError,
    UnknownPrice,
    UnknownTenant,
)
from llm_budgets.models import Counter, Reservation, ReservationState, UsageRecord
from llm_budgets.pricing.tokens import count_input_tokens
from llm_budgets.usage import from_anthropic
from tests.api import BASE, new_key, reserve_body
from tests.concurrency import run_threads
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.mark.concurrency
def test_the_seed_race_over_http(live_server: Any) -> None:
    """10 concurrent POSTs against limit 100 at 30 each: exactly 3 x 201 and 7 x 429."""
    seed(limit="100")
    key = new_key("acme")
    url = f"{live_server.url}{BASE}reservations"

    def post(_: int) -> int:
        with httpx.Client(timeout=30) as http:
            response = http.post(
                url, json=reserve_body(), headers={"Authorization": f"Api-Key {key}"}
            )
        return response.status_code

    statuses = run_threads(10, post)
    assert sorted(statuses) == [201] * 3 + [429] * 7, statuses
    assert Counter.objects.get().reserved == Decimal(90)
    assert Reservation.objects.count() == 3


@pytest.fixture
def client(live_server: Any) -> BudgetsClient:
    seed(limit="100")
    return BudgetsClient(f"{live_server.url}{BASE}", new_key("acme"))


def reserve(client: BudgetsClient, **kwargs: Any) -> RemoteHold:
    return client.reserve(
        provider=FAKE_PROVIDER,
        model=kwargs.pop("model", FAKE_MODEL),
        input_tokens=0,
        max_output_tokens=kwargs.pop("max_output_tokens", 1000),
        **kwargs,
    )


def test_reserve_and_commit_in_a_with_block(client: BudgetsClient) -> None:
    with reserve(client, end_user="u-1") as hold:
        assert (hold.amount, hold.currency, hold.state) == (Decimal(30), "USD", "held")
        assert hold.max_output_tokens == 1000
        result = hold.commit(input_tokens=0, output_tokens=400)
    assert (result.cost, result.overage, result.state) == (Decimal(12), Decimal(0), "committed")
    assert result == client.commit(hold.id, input_tokens=0, output_tokens=400)
    assert Reservation.objects.get().state == ReservationState.COMMITTED
    [status] = client.status(tenant="acme")
    assert (status["spent"], status["reserved"], status["remaining"]) == (12, 0, 88)


def test_an_exception_in_the_block_releases(client: BudgetsClient) -> None:
    with pytest.raises(RuntimeError), reserve(client):
        raise RuntimeError("provider said no")
    assert Reservation.objects.get().state == ReservationState.RELEASED


def test_a_timeout_in_the_block_keeps_the_hold(client: BudgetsClient) -> None:
    with pytest.raises(TimeoutError), reserve(client):
        raise TimeoutError
    # Still counted, as UNCERTAIN (POST .../uncertain), until usage or the reconcile job.
    assert Reservation.objects.get().state == ReservationState.UNCERTAIN
    assert Counter.objects.get().reserved > 0


def test_leaving_the_block_unsettled_is_an_error(client: BudgetsClient) -> None:
    with pytest.raises(ReservationStateError), reserve(client):
        pass
    assert Reservation.objects.get().state == ReservationState.HELD


def test_release_extend_get(client: BudgetsClient) -> None:
    hold = reserve(client, ttl=60)
    first_expiry = hold.expires_at
    assert hold.extend(ttl=3600).expires_at > first_expiry
    assert client.get(hold.id).expires_at == hold.expires_at
    assert hold.release() == "released"
    assert client.release(hold.id) == "released"
    with pytest.raises(ReservationStateError) as caught:
        hold.commit(input_tokens=0, output_tokens=1)
    assert caught.value.state == "released"  # type: ignore[attr-defined]


def test_a_budget_refusal_is_the_same_exception(client: BudgetsClient) -> None:
    for _ in range(3):
        reserve(client)
    with pytest.raises(BudgetExceeded) as caught:
        reserve(client)
    refusal = caught.value
    assert (refusal.limit, refusal.remaining, refusal.requested) == (Decimal(100), 10, 30)
    assert refusal.scope == "tenant acme"
    assert refusal.window == "month"
    assert refusal.retry_after is not None
    assert refusal.retry_after > 0
    assert "Budget exceeded" in str(refusal)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": "nope"}, UnknownPrice),
        ({"max_output_tokens": None}, OutputCeilingRequired),
        ({"max_output_tokens": 0}, InvalidUsage),
        ({"tenant": "someone-else"}, UnknownTenant),
    ],
)
def test_refusals_are_the_same_exception_classes(
    client: BudgetsClient, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        reserve(client, **kwargs)
    assert not Reservation.objects.exists()


def test_invalid_usage_names_the_field(client: BudgetsClient) -> None:
    with pytest.raises(InvalidUsage) as caught:
        reserve(client, max_output_tokens=0)
    assert caught.value.field == "max_output_tokens"  # type: ignore[attr-defined]


def test_unknown_reservations_and_bad_keys(client: BudgetsClient, live_server: Any) -> None:
    with pytest.raises(ReservationNotFound):
        client.get("00000000-0000-0000-0000-000000000000")
    stranger = BudgetsClient(f"{live_server.url}{BASE}", "abcdefgh.nope")
    with pytest.raises(ApiError) as caught:
        stranger.status(tenant="acme")
    assert (caught.value.status_code, caught.value.code) == (401, "invalid_api_key")


def test_quote_reserve_by_messages_and_commit_translated_usage(client: BudgetsClient) -> None:
    budgets.set_price(
        provider="anthropic",
        model="claude-x",
        input_per_mtok="3",
        output_per_mtok="15",
        cached_input_per_mtok="0.3",
        cache_write_per_mtok="3.75",
        tool_fees={"web_search": "0.01"},
    )
    messages = [{"role": "user", "content": "What does this cost?"}]
    counted = count_input_tokens(provider="anthropic", model="claude-x", messages=messages)
    quote = client.quote(
        model="claude-x", messages=messages, max_output_tokens=100, max_tool_calls={"web_search": 1}
    )
    assert (quote.provider, quote.input_tokens, quote.pricing_basis) == (
        "anthropic",
        counted,
        "price",
    )
    assert quote.price is not None
    assert quote.price["model"] == "claude-x"
    assert quote.amount == sum(item["amount"] for item in quote.items)
    assert {item["dimension"] for item in quote.items} >= {
        "output_per_mtok",
        "tool:web_search",
        "input_tolerance",
    }
    # The input tolerance (issue #38): 10% of the counted input + 256 tokens at 3.75 per million.
    tolerance = counted // 10 + 256
    assert quote.input_tolerance == Decimal(tolerance) * Decimal("3.75") / 1_000_000
    [draw] = quote.budgets
    assert (draw["scope_label"], draw["would_hold"], draw["fits"]) == (
        "tenant acme",
        quote.amount,
        True,
    )
    assert quote.admissible
    assert not Reservation.objects.exists()  # a quote holds nothing

    hold = client.reserve(
        model="claude-x",
        messages=messages,
        max_output_tokens=100,
        max_tool_calls={"web_search": 1},
        tags={"feature": "pricing-page"},
    )
    assert (hold.amount, hold.data["input_tokens"]) == (quote.amount, counted)
    assert hold.data["tags"] == {"feature": "pricing-page"}
    anthropic_usage = {
        "input_tokens": 2,  # Anthropic's: excludes cache reads and writes
        "cache_read_input_tokens": 6,
        "cache_creation_input_tokens": 4,
        "output_tokens": 50,
        "server_tool_use": {"web_search_requests": 1},
    }
    result = hold.commit(usage=from_anthropic(anthropic_usage))
    # (2*3 + 6*0.3 + 4*3.75 + 50*15) per million, plus one search
    assert result.cost == Decimal("772.8") / 1_000_000 + Decimal("0.01")
    line = UsageRecord.objects.get()
    assert (line.input_tokens, line.cached_input_tokens, line.cache_write_tokens) == (12, 6, 4)
    assert line.tags == {"feature": "pricing-page"}
    assert (
        client.commit(
            hold.id, input_tokens=12, output_tokens=50, cached_input_tokens=6, cache_write_tokens=4
        )
        == result
    )  # a repeat returns the first result


def test_quote_errors_are_the_same_exception_classes(client: BudgetsClient) -> None:
    with pytest.raises(UnknownPrice):
        client.quote(model="nope", input_tokens=0, max_output_tokens=1)
    with pytest.raises(UnknownTenant):
        client.quote(tenant="someone-else", model=FAKE_MODEL, input_tokens=0, max_output_tokens=1)
    with pytest.raises(InvalidUsage) as caught:
        client.quote(model=FAKE_MODEL, input_tokens=1, prompt="both", max_output_tokens=1)
    assert caught.value.field == "input_tokens"  # type: ignore[attr-defined]
