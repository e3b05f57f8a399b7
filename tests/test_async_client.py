"""``AsyncBudgetsClient`` and ``AsyncRemoteHold`` without a server (issue #31, item 2): the
sync client's retry rule, error rebuilding and with-block policy, awaited. Each operation is
defined once for both clients (``llm_budgets.client._Api``); these tests hold the async driver
to what tests/test_client.py holds the sync one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import pytest

from llm_budgets.client import AsyncBudgetsClient, AsyncRemoteHold
from llm_budgets.exceptions import BudgetExceeded, LedgerUnavailable
from tests.test_client import HOLD, LEDGER_DOWN

REFUSAL = {
    "error": {
        "code": "budget_exceeded",
        "message": "Budget exceeded: ...",
        "budget": {"id": 1, "limit": "100", "remaining": "10", "currency": "USD"},
        "requested": "30",
    }
}


def scripted(
    *responses: httpx.Response | Callable[[httpx.Request], Any],
) -> tuple[AsyncBudgetsClient, list[httpx.Request], list[float]]:
    """An async client whose transport answers ``responses`` in order (a callable: awaited for
    its answer) and records the requests and the waits between attempts."""
    seen: list[httpx.Request] = []
    waits: list[float] = []
    queue = list(responses)

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0)
        if callable(answer):
            answer = await answer(request)
        assert isinstance(answer, httpx.Response)
        return answer

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = AsyncBudgetsClient("http://api.test/v1", "abc.def", http=http, sleep=sleep)
    return client, seen, waits


def test_a_post_is_retried_with_its_idempotency_key_after_the_retry_after() -> None:
    client, seen, waits = scripted(
        httpx.Response(503, json=LEDGER_DOWN, headers={"Retry-After": "1"}),
        httpx.Response(201, json=HOLD),
    )

    async def reserve() -> AsyncRemoteHold:
        async with client:
            return await client.areserve(model="m30", input_tokens=0, max_output_tokens=1000)

    hold = asyncio.run(reserve())
    assert isinstance(hold, AsyncRemoteHold)
    assert hold.amount == Decimal(30)
    assert waits == [1]
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1
    assert seen[0].url == "http://api.test/v1/reservations"


def test_errors_are_the_in_process_exceptions_and_a_refusal_is_not_retried() -> None:
    client, seen, _ = scripted(
        httpx.Response(429, json=REFUSAL), httpx.Response(503, json=LEDGER_DOWN)
    )
    client.auto_idempotency_keys = False

    async def refused() -> None:
        with pytest.raises(BudgetExceeded) as caught:
            await client.areserve(model="m30", input_tokens=0, max_output_tokens=1000)
        assert caught.value.remaining == Decimal(10)
        with pytest.raises(LedgerUnavailable):  # a POST without a key: not retried
            await client.arelease(HOLD["id"])

    asyncio.run(refused())
    assert len(seen) == 2


def settling(action: str) -> httpx.Response:
    states = {"release": "released", "uncertain": "uncertain", "commit": "committed"}
    return httpx.Response(200, json={**HOLD, "state": states[action]})


@pytest.mark.parametrize(
    ("raising", "action"),
    [
        (ValueError, "release"),
        (httpx.ReadTimeout, "uncertain"),
        (asyncio.CancelledError, "uncertain"),
    ],
)
def test_async_with_leaves_by_the_with_block_policy(
    raising: type[BaseException], action: str
) -> None:
    client, seen, _ = scripted(httpx.Response(201, json=HOLD), settling(action))

    async def leave() -> str:
        with pytest.raises(raising):
            async with client.areserve(model="m30", input_tokens=0, max_output_tokens=10) as hold:
                raise raising("in the block")
        return hold.state

    assert asyncio.run(leave()) == {"release": "released", "uncertain": "uncertain"}[action]
    assert seen[-1].url.path.endswith("/" + action)


def test_a_task_cancelled_while_the_server_admits_releases_what_it_was_given() -> None:
    """The reservation request is in flight when the task is cancelled: the request runs to
    its answer, and the hold it brings back, which the caller never got, is released."""
    admitting, answer = asyncio.Event(), asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        admitting.set()
        await answer.wait()
        return httpx.Response(201, json=HOLD)

    client, seen, _ = scripted(slow, settling("release"))

    async def cancelled() -> None:
        task = asyncio.ensure_future(
            client.areserve(model="m30", input_tokens=0, max_output_tokens=10)
        )
        await admitting.wait()
        task.cancel()
        await asyncio.sleep(0)
        answer.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert [r.url.path.rsplit("/", 1)[-1] for r in seen] == ["reservations", "release"]
