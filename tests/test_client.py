"""The HTTP client's own rules, without a server: retries, error rebuilding, no Django needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal

import httpx
import pytest

from llm_budgets.client import ApiError, BudgetsClient
from llm_budgets.exceptions import BudgetExceeded, LedgerUnavailable

HOLD = {
    "id": "6f1c1f0e-8a55-4a43-9b38-8a0c2f1b5a11",
    "state": "held",
    "amount": "30",
    "currency": "USD",
    "model": "m30",
    "max_output_tokens": 1000,
    "expires_at": "2030-01-01T00:00:00Z",
    "degraded": False,
}
LEDGER_DOWN = {"error": {"code": "ledger_unavailable", "message": "down", "retry_after": 1}}


def scripted(*responses: httpx.Response) -> tuple[BudgetsClient, list[httpx.Request]]:
    """A client whose transport answers ``responses`` in order and records the requests."""
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = BudgetsClient("http://api.test/v1", "abc.def", http=http, sleep=lambda _: None)
    return client, seen


def test_a_post_carries_a_fresh_idempotency_key_and_is_retried_with_it() -> None:
    client, seen = scripted(
        httpx.Response(503, json=LEDGER_DOWN, headers={"Retry-After": "1"}),
        httpx.Response(201, json=HOLD),
    )
    hold = client.reserve(model="m30", input_tokens=0, max_output_tokens=1000)
    assert hold.amount == Decimal(30)
    assert len(seen) == 2
    keys = {r.headers["Idempotency-Key"] for r in seen}
    assert len(keys) == 1
    assert seen[0].headers["Authorization"] == "Api-Key abc.def"
    assert seen[0].url == "http://api.test/v1/reservations"


def test_each_logical_call_has_a_key_of_its_own_and_a_settlement_retries_with_it() -> None:
    """One key per call, the same on each of its retries (issue #38): a commit whose answer was
    lost is retried as the same request, which settles once; a second reserve is another call."""
    committed = {"id": HOLD["id"], "state": "committed", "currency": "USD"}
    committed.update(cost="15", reserved="0", overage="0")
    client, seen = scripted(
        httpx.Response(201, json=HOLD),
        httpx.Response(201, json=HOLD),
        httpx.Response(503, json=LEDGER_DOWN, headers={"Retry-After": "1"}),
        httpx.Response(200, json=committed),
    )
    client.reserve(model="m30", input_tokens=0, max_output_tokens=1000)
    hold = client.reserve(model="m30", input_tokens=0, max_output_tokens=1000)
    hold.commit(input_tokens=0, output_tokens=500)
    keys = [r.headers.get("Idempotency-Key") for r in seen]
    assert all(keys)
    assert keys[0] != keys[1]  # two reserves: two calls
    assert keys[2] == keys[3] != keys[1]  # the commit and its retry: one call
    assert seen[3].url.path.endswith(f"reservations/{HOLD['id']}/commit")


def test_a_post_without_a_key_is_never_retried() -> None:
    client, seen = scripted(httpx.Response(503, json=LEDGER_DOWN), httpx.Response(201, json=HOLD))
    client.auto_idempotency_keys = False
    with pytest.raises(LedgerUnavailable) as caught:
        client.reserve(model="m30", input_tokens=0, max_output_tokens=1000)
    assert caught.value.retry_after == 1
    assert len(seen) == 1
    assert "Idempotency-Key" not in seen[0].headers


def test_transport_errors_retry_only_idempotent_calls() -> None:
    calls: list[httpx.Request] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ConnectError("reset", request=request)
        return httpx.Response(200, json=HOLD)

    def client_with(handler: Callable[[httpx.Request], httpx.Response]) -> BudgetsClient:
        http = httpx.Client(transport=httpx.MockTransport(handler))
        return BudgetsClient("http://api.test/v1/", "k.s", http=http, sleep=lambda _: None)

    assert client_with(flaky).get(HOLD["id"]).state == "held"  # a GET: retried
    assert len(calls) == 2
    calls.clear()
    no_keys = client_with(flaky)
    no_keys.auto_idempotency_keys = False
    with pytest.raises(httpx.ConnectError):
        no_keys.release(HOLD["id"])  # a POST without a key: not retried
    assert len(calls) == 1


def test_a_budget_refusal_is_not_retried() -> None:
    refusal = {
        "error": {
            "code": "budget_exceeded",
            "message": "Budget exceeded: ...",
            "budget": {
                "id": 1,
                "scope": "tenant acme",
                "window": "month",
                "limit": "100",
                "remaining": "10",
                "currency": "USD",
                "resets_at": "2099-01-01T00:00:00+00:00",
            },
            "requested": "30",
        }
    }
    client, seen = scripted(httpx.Response(429, json=refusal), httpx.Response(201, json=HOLD))
    with pytest.raises(BudgetExceeded) as caught:
        client.reserve(model="m30", input_tokens=0, max_output_tokens=1000)
    assert len(seen) == 1
    assert caught.value.remaining == Decimal(10)
    assert caught.value.budget_id == 1


def test_throttling_is_retried_after_retry_after() -> None:
    waits: list[float] = []
    client, seen = scripted(
        httpx.Response(
            429,
            json={"error": {"code": "throttled", "message": "slow down"}},
            headers={"Retry-After": "2"},
        ),
        httpx.Response(200, json=HOLD),
    )
    client._sleep = waits.append
    client.get(HOLD["id"])
    assert waits == [2]
    assert len(seen) == 2


def test_unknown_error_codes_and_non_json_bodies_become_api_errors() -> None:
    client, _ = scripted(
        httpx.Response(418, json={"error": {"code": "teapot", "message": "short and stout"}}),
        httpx.Response(502, text="<html>bad gateway</html>"),
    )
    with pytest.raises(ApiError) as caught:
        client.get(HOLD["id"])
    assert (caught.value.status_code, caught.value.code) == (418, "teapot")
    with pytest.raises(ApiError) as caught:
        client.get(HOLD["id"])
    assert caught.value.status_code == 502


def test_the_client_needs_no_django_settings() -> None:
    code = """
import json
from llm_budgets.client import error_from_response
import httpx
body = {"error": {"code": "budget_exceeded", "message": "no", "budget": {
    "scope": "tenant a", "window": "day", "limit": "1", "remaining": "0", "currency": "USD",
    "resets_at": "2099-01-01T00:00:00+00:00"}, "requested": "2"}}
request = httpx.Request("POST", "http://x/reservations")
exc = error_from_response(httpx.Response(429, json=body, request=request))
print(json.dumps([type(exc).__name__, exc.retry_after > 0]))
"""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == ["BudgetExceeded", True]
