"""``llm_budgets.holds``: one with-block policy for the in-process ``Hold`` and the client's
``RemoteHold`` (issue #24, item 2). Both leave a block the same way in each of its three cases:
an error releases, a timeout marks the hold uncertain, no settlement is refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from llm_budgets.client import BudgetsClient, RemoteHold
from llm_budgets.exceptions import ReservationStateError
from llm_budgets.holds import HoldPolicy, left_held_message
from tests.factories import reserve_30, seed

HOLD_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


def remote_hold() -> tuple[RemoteHold, list[str]]:
    """A RemoteHold whose server records each action and answers with the new state."""
    done: list[str] = []
    states = {"release": "released", "uncertain": "uncertain"}

    def serve(request: httpx.Request) -> httpx.Response:
        action = request.url.path.rsplit("/", 1)[-1]
        done.append(action)
        return httpx.Response(200, json={**reservation, "state": states[action]})

    reservation = {
        "id": str(HOLD_ID),
        "state": "held",
        "amount": "30",
        "currency": "USD",
        "model": "m",
        "max_output_tokens": 10,
        "expires_at": "2030-01-01T00:00:00+00:00",
    }
    client = BudgetsClient(
        "http://budgets.test/v1/", "k.s", http=httpx.Client(transport=httpx.MockTransport(serve))
    )
    return RemoteHold(client, dict(reservation)), done


def leave(hold: HoldPolicy, raising: type[BaseException] | None) -> str:
    """Leave a with-block on ``hold`` (raising ``raising`` inside it); what the caller sees."""
    try:
        with hold:
            if raising is not None:
                raise raising("in the block")
    except ReservationStateError as refused:
        return "refused: " + refused.message.replace(str(hold.id), "<id>")
    except BaseException as passed:
        return f"{type(passed).__name__} passed on, hold {hold.state}"
    return f"left, hold {hold.state}"


CASES: list[tuple[type[BaseException] | None, str]] = [
    (ValueError, "ValueError passed on, hold released"),
    (TimeoutError, "TimeoutError passed on, hold uncertain"),
    (None, "refused: " + left_held_message(HOLD_ID).replace(str(HOLD_ID), "<id>")),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("raising", "seen"), CASES)
def test_both_holds_leave_a_block_alike(raising: type[BaseException] | None, seen: str) -> None:
    seed()
    here = reserve_30()
    there, done = remote_hold()
    assert leave(here, raising) == seen
    assert leave(there, raising) == seen
    assert done == {ValueError: ["release"], TimeoutError: ["uncertain"], None: []}[raising]


def test_an_http_timeout_is_a_timeout_for_a_remote_hold() -> None:
    there, done = remote_hold()
    assert leave(there, httpx.ReadTimeout) == "ReadTimeout passed on, hold uncertain"
    assert done == ["uncertain"]


@pytest.mark.django_db
def test_a_settled_hold_leaves_its_block_quietly() -> None:
    seed()
    with reserve_30() as hold:
        hold.release()
    assert hold.state == "released"
    there, done = remote_hold()
    with there:
        there.release()
    assert (there.state, done) == ("released", ["release"])


def test_a_server_without_uncertain_keeps_the_hold() -> None:
    def serve(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "not_implemented", "message": "No UNCERTAIN here."}}
        return httpx.Response(501, content=json.dumps(body).encode())

    http = httpx.Client(transport=httpx.MockTransport(serve))
    client = BudgetsClient("http://budgets.test/v1/", "k.s", http=http, max_retries=0)
    hold = RemoteHold(client, {"id": str(HOLD_ID), "state": "held"})
    assert leave(hold, TimeoutError) == "TimeoutError passed on, hold held"


@pytest.mark.django_db
def test_a_stream_closed_mid_way_leaves_its_hold_uncertain() -> None:
    """A generator closed while its block is open (a streamed response whose client went away)
    produced tokens already: the hold stays counted, never released."""
    from llm_budgets import budgets

    seed()

    def stream() -> Iterator[object]:
        with reserve_30() as hold:
            yield hold
            yield "the rest"

    body = stream()
    hold = next(body)
    body.close()
    assert budgets.get(hold.id).state == "uncertain"  # type: ignore[attr-defined]
