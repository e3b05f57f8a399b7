"""What leaving a ``with`` block does to a hold: one policy for ``llm_budgets.budgets.Hold`` (in
process) and ``llm_budgets.client.RemoteHold`` (over HTTP), and for their ``async with`` forms
(``budgets.areserve``, ``client.AsyncRemoteHold``).

Bottom layer: no Django, no ORM (the client imports it and runs without Django settings).

- The block ends normally and the hold is still held: ``ReservationStateError``. Nothing was
  settled, and nothing is guessed: the hold stays until it expires and is then charged as
  estimated spend.
- The block raises a timeout (:attr:`HoldPolicy._timeouts`), its task is cancelled
  (``asyncio.CancelledError``), or the generator it runs in is closed (``GeneratorExit``: a
  streamed response whose client went away): none is proof the provider stopped or produced
  nothing, so the hold is marked UNCERTAIN and stays counted until usage arrives or the
  reconcile job settles it.
- The block raises anything else: the hold is released.
- The hold was already settled in the block (commit, release, uncertain): nothing more.

:func:`leaving` decides; ``__exit__`` (:class:`HoldPolicy`) and ``__aexit__``
(:class:`AsyncHoldPolicy`) only carry its decision out. :class:`Admission` is what an async
``reserve`` returns: awaited, the hold; entered with ``async with``, the hold under the policy.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar
from uuid import UUID

from llm_budgets.exceptions import ReservationStateError

HELD = "held"  # ReservationState.HELD's value, without importing the models

logger = logging.getLogger("llm_budgets")

T = TypeVar("T")
H = TypeVar("H", bound="AsyncHoldPolicy")


def left_held_message(hold_id: UUID) -> str:
    """What ``ReservationStateError`` says when a block is left with its hold still held."""
    return (
        f"Reservation {hold_id} left its with-block still held: call hold.commit(...) "
        "after the provider answers, or hold.release() if it produced nothing. The hold "
        "stays until it expires and is then charged as estimated spend."
    )


class _Leaves:
    """What a hold class gives the policy: its ``id``, its ``state`` and which exceptions count
    as timeouts (:attr:`_timeouts`: a class may widen it, as the client adds httpx's)."""

    # Exceptions that mean "the outcome is unknown", not "the call failed". A cancelled task
    # (the client went away, a timeout around the await) is one; so is a closed generator (a
    # stream whose client went away mid-way: tokens were produced, release would drop them).
    _timeouts: ClassVar[tuple[type[BaseException], ...]] = (
        TimeoutError,
        asyncio.CancelledError,
        GeneratorExit,
    )

    @property
    def id(self) -> UUID:
        raise NotImplementedError

    @property
    def state(self) -> str:
        raise NotImplementedError


def leaving(
    hold: _Leaves, exc_type: type[BaseException] | None
) -> Literal["release", "uncertain"] | None:
    """What leaving a block does to ``hold`` (the module's rules, the one definition):
    ``"release"``, ``"uncertain"`` or nothing (None); raises ``ReservationStateError`` for a
    block left without settling."""
    if hold.state != HELD:
        return None
    if exc_type is None:
        raise ReservationStateError(left_held_message(hold.id), state=hold.state)
    if issubclass(exc_type, hold._timeouts):
        logger.warning(
            "llm_budgets: reservation %s timed out; its hold stays counted (uncertain).",
            hold.id,
        )
        return "uncertain"
    return "release"


class HoldPolicy(_Leaves):
    """The with-block policy (see the module). A hold class gives ``id``, ``state``,
    ``release()`` and ``mark_uncertain()``; it may override :meth:`_timed_out` (the client
    tolerates a server without the UNCERTAIN state)."""

    def release(self) -> str:
        raise NotImplementedError

    def mark_uncertain(self) -> str:
        raise NotImplementedError

    def _timed_out(self) -> None:
        self.mark_uncertain()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome = leaving(self, exc_type)
        if outcome == "uncertain":
            self._timed_out()
        elif outcome == "release":
            self.release()


class AsyncHoldPolicy(_Leaves):
    """The same policy for ``async with`` (:func:`leaving` decides). A hold class gives ``id``,
    ``state``, ``arelease()`` and ``amark_uncertain()``. The settlement runs to its end even if
    the task is cancelled again while it waits (:func:`run_to_end`)."""

    async def arelease(self) -> str:
        raise NotImplementedError

    async def amark_uncertain(self) -> str:
        raise NotImplementedError

    async def _atimed_out(self) -> None:
        await self.amark_uncertain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome = leaving(self, exc_type)
        if outcome == "uncertain":
            await run_to_end(self._atimed_out())
        elif outcome == "release":
            await run_to_end(self.arelease())


async def run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` to its end even if the awaiting task is cancelled meanwhile (a settlement
    must not be lost to a second cancellation, nor to one that lands before the worker thread
    picked the job up), then pass the cancellation on."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
            continue
        break
    if cancelled:
        raise asyncio.CancelledError
    return result


class Admission(Generic[H]):
    """What an async ``reserve`` returns (``budgets.areserve``, ``AsyncBudgetsClient.areserve``):
    ``await`` it for the hold, or enter it with ``async with`` to hold under the policy.

    A task cancelled while admission runs never loses a hold: the admission runs to its end in
    its worker (its transaction is never cut in the middle), and the hold it took, which the
    cancelled caller never got, is released at once (the provider was never called), before
    the cancellation goes on."""

    def __init__(self, admit: Callable[[], Awaitable[H]]) -> None:
        self._admit = admit
        self._hold: H | None = None

    def __await__(self) -> Generator[Any, None, H]:
        return self._admitted().__await__()

    async def _admitted(self) -> H:
        async def admit() -> H:
            return await self._admit()

        task = asyncio.ensure_future(admit())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                logger.warning(
                    "llm_budgets: a task was cancelled while admitting; the admission runs to "
                    "its end and what it holds is released."
                )
                await run_to_end(_release_once_admitted(task))
            raise

    async def __aenter__(self) -> H:
        self._hold = await self._admitted()
        return await self._hold.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._hold is not None
        await self._hold.__aexit__(exc_type, exc, tb)


async def _release_once_admitted(admission: asyncio.Future[H]) -> None:
    try:
        hold = await admission
    except BaseException:  # refused, or failed: nothing was held
        return
    logger.warning(
        "llm_budgets: reservation %s was admitted for a cancelled task; released.", hold.id
    )
    await hold.arelease()


def ttl_renamed(ttl: int | None, ttl_seconds: int | None, *, where: str) -> int:
    """``ttl``, or the deprecated ``ttl_seconds`` spelling of it (a ``DeprecationWarning``; one
    release, then it goes): ``extend`` takes the name ``reserve`` does."""
    if ttl_seconds is not None:
        if ttl is not None:
            raise TypeError(f"{where}() takes ttl, not both ttl and ttl_seconds.")
        warnings.warn(
            f"{where}(ttl_seconds=...) is deprecated: write {where}(ttl=...), the name reserve() "
            "takes. ttl_seconds goes in the next release.",
            DeprecationWarning,
            stacklevel=3,
        )
        return ttl_seconds
    if ttl is None:
        raise TypeError(f"{where}() missing required keyword argument: 'ttl'")
    return ttl
