"""The public API's async twins (issue #31, item 1): ``areserve``, ``acommit``, ... and
``async with budgets.areserve(...) as hold:``, which leaves its block by the sync ``with``'s
policy (``llm_budgets.holds``); a task cancelled mid-admission or mid-block never loses a hold.

Each test is sync and runs its coroutine with ``async_to_sync``: the twins' thread-sensitive
calls then come back to the test's own thread and database connection (its transaction), as in
a Django request."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from llm_budgets import budgets
from llm_budgets.engine import admission
from llm_budgets.exceptions import BudgetExceeded, ReservationStateError
from llm_budgets.holds import Admission, run_to_end
from llm_budgets.models import Counter, Reservation
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed
from tests.test_holds import leave

CALL = {
    "tenant": "acme",
    "provider": FAKE_PROVIDER,
    "model": FAKE_MODEL,
    "input_tokens": 0,
    "max_output_tokens": 1000,
}
TWINS = {name for name in budgets.__all__ if name.startswith("a") and name[1:] in budgets.__all__}
HOLD_TWINS = {"acommit", "arelease", "amark_uncertain", "aextend", "arefresh"}


def run(coroutine: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return async_to_sync(coroutine)()


def test_every_twin_takes_what_its_sync_function_takes() -> None:
    assert {
        "areserve",
        "acommit",
        "arelease",
        "aextend",
        "amark_uncertain",
        "astatus",
        "aquote",
        "aexplain",
        "aclose_run",
    } <= TWINS
    for name in TWINS:
        twin, function = getattr(budgets, name), getattr(budgets, name[1:])
        assert twin.__name__ == name
        assert inspect.signature(twin) == inspect.signature(function), name
        assert inspect.iscoroutinefunction(twin) == (name != "areserve"), name
    for name in HOLD_TWINS:
        twin, method = getattr(budgets.Hold, name), getattr(budgets.Hold, name[1:])
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin) == inspect.signature(method), name


@pytest.mark.django_db
def test_await_reserve_commit_and_read() -> None:
    seed(limit="100")

    async def calls() -> tuple[Any, ...]:
        hold = await budgets.areserve(**CALL)
        assert isinstance(hold, budgets.Hold)
        result = await hold.acommit(input_tokens=0, output_tokens=100)
        again = await budgets.acommit(hold.id, input_tokens=0, output_tokens=100)
        other = await budgets.areserve(**CALL)
        released = await budgets.arelease(other.id)
        status = await budgets.astatus(tenant="acme")
        quote = await budgets.aquote(**CALL)
        explained = await budgets.aexplain(**CALL)
        return (
            hold.state,
            result.cost,
            again.cost,
            released,
            status[0].spent,
            quote.estimate.amount,
            explained,
        )

    state, cost, again, released, spent, quoted, explained = run(calls)
    assert (state, cost, again, released, spent, quoted) == (
        "committed",
        Decimal(3),
        Decimal(3),
        "released",
        Decimal(3),
        Decimal(30),
    )
    assert explained.amount == Decimal(30)


@pytest.mark.django_db
def test_a_refusal_is_raised_by_the_await() -> None:
    seed(limit="50")
    reserve_30()

    async def refused() -> None:
        await budgets.areserve(**CALL)

    with pytest.raises(BudgetExceeded):
        run(refused)


# Leaving ``async with``: the sync ``with``'s outcomes, case by case.


async def aleave(entered: Admission[budgets.Hold], raising: type[BaseException] | None) -> str:
    """``leave`` (tests/test_holds.py) with ``async with``."""
    hold = None
    try:
        async with entered as hold:
            if raising is not None:
                raise raising("in the block")
    except ReservationStateError as refused:
        assert hold is not None
        return "refused: " + refused.message.replace(str(hold.id), "<id>")
    except BaseException as passed:
        assert hold is not None
        return f"{type(passed).__name__} passed on, hold {hold.state}"
    return "left"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raising", [ValueError, TimeoutError, asyncio.CancelledError, None], ids=str
)
def test_async_with_leaves_as_the_sync_with(raising: type[BaseException] | None) -> None:
    seed(limit="1000")
    seen_sync = leave(reserve_30(), raising)

    async def leaving() -> str:
        return await aleave(budgets.areserve(**CALL), raising)

    assert run(leaving) == seen_sync
    states = set(Reservation.objects.values_list("state", flat=True))
    assert states == {seen_sync.rpartition(" ")[2] if raising else "held"}


@pytest.mark.django_db
def test_a_block_settled_inside_is_left_alone() -> None:
    seed(limit="100")

    async def settled() -> str:
        async with budgets.areserve(**CALL) as hold:
            await hold.acommit(input_tokens=0, output_tokens=10)
        return hold.state

    assert run(settled) == "committed"


# Cancellation.


@pytest.mark.django_db
def test_a_task_cancelled_mid_admission_releases_the_hold_it_never_got(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admission is held in its worker thread until the task is cancelled; it then runs to
    its end (one transaction, never cut) and the hold it took is released before the
    cancellation goes on."""
    seed(limit="100")
    entered, proceed = threading.Event(), threading.Event()
    admit = admission.reservation_admit

    def slow_admit(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert proceed.wait(30)
        return admit(*args, **kwargs)

    monkeypatch.setattr(admission, "reservation_admit", slow_admit)

    async def cancelled() -> str:
        task = asyncio.ensure_future(budgets.areserve(**CALL))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        task.cancel()
        await asyncio.sleep(0)  # let the task see its cancellation while admission waits
        proceed.set()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    assert run(cancelled) == "cancelled"
    assert list(Reservation.objects.values_list("state", flat=True)) == ["released"]
    assert Counter.objects.get().reserved == 0


@pytest.mark.django_db
def test_a_task_cancelled_while_it_holds_marks_the_hold_uncertain() -> None:
    seed(limit="100")

    async def cancelled() -> str:
        inside = asyncio.Event()

        async def call() -> None:
            async with budgets.areserve(**CALL):
                inside.set()
                await asyncio.Event().wait()  # the provider call, never answering

        task = asyncio.ensure_future(call())
        await inside.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    assert run(cancelled) == "cancelled"
    assert list(Reservation.objects.values_list("state", flat=True)) == ["uncertain"]
    assert Counter.objects.get().reserved == Decimal(30)  # still counted


def test_a_settlement_runs_to_its_end_through_a_second_cancellation() -> None:
    async def twice() -> list[str]:
        done: list[str] = []
        go = asyncio.Event()

        async def settle() -> None:
            await go.wait()
            done.append("settled")

        async def leaving() -> None:
            await run_to_end(settle())

        task = asyncio.ensure_future(leaving())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return done

    assert asyncio.run(twice()) == ["settled"]
