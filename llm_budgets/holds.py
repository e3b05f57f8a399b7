"""What leaving a ``with`` block does to a hold: one policy for ``llm_budgets.budgets.Hold`` (in
process) and ``llm_budgets.client.RemoteHold`` (over HTTP).

Bottom layer: no Django, no ORM (the client imports it and runs without Django settings).

- The block ends normally and the hold is still held: ``ReservationStateError``. Nothing was
  settled, and nothing is guessed: the hold stays until it expires and is then charged as
  estimated spend.
- The block raises a timeout (:attr:`HoldPolicy._timeouts`): a timeout is no proof the provider
  stopped, so the hold is marked UNCERTAIN and stays counted until usage arrives or the reconcile
  job settles it.
- The block raises anything else: the hold is released.
- The hold was already settled in the block (commit, release, uncertain): nothing more.
"""

from __future__ import annotations

import logging
import warnings
from types import TracebackType
from typing import ClassVar, Self
from uuid import UUID

from llm_budgets.exceptions import ReservationStateError

HELD = "held"  # ReservationState.HELD's value, without importing the models

logger = logging.getLogger("llm_budgets")


def left_held_message(hold_id: UUID) -> str:
    """What ``ReservationStateError`` says when a block is left with its hold still held."""
    return (
        f"Reservation {hold_id} left its with-block still held: call hold.commit(...) "
        "after the provider answers, or hold.release() if it produced nothing. The hold "
        "stays until it expires and is then charged as estimated spend."
    )


class HoldPolicy:
    """The with-block policy (see the module). A hold class gives ``id``, ``state``,
    ``release()`` and ``mark_uncertain()``; a class may widen :attr:`_timeouts` (the client adds
    httpx's) and override :meth:`_timed_out` (the client tolerates a server without the
    UNCERTAIN state)."""

    # Exceptions that mean "the outcome is unknown", not "the call failed".
    _timeouts: ClassVar[tuple[type[BaseException], ...]] = (TimeoutError,)

    # Provided by the hold classes.
    @property
    def id(self) -> UUID:
        raise NotImplementedError

    @property
    def state(self) -> str:
        raise NotImplementedError

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
        if self.state != HELD:
            return
        if exc_type is None:
            raise ReservationStateError(left_held_message(self.id), state=self.state)
        if issubclass(exc_type, self._timeouts):
            logger.warning(
                "llm_budgets: reservation %s timed out; its hold stays counted (uncertain).",
                self.id,
            )
            self._timed_out()
            return
        self.release()


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
