"""Sending a guarded request, and guarded streams: the SDK's own stream, iterated through the
guard's accounting.

Each SDK module subclasses :class:`SyncStreamGuard` / :class:`AsyncStreamGuard` together with the
SDK's ``Stream`` / ``AsyncStream``, so a guarded stream is still an instance of the SDK's class.
Every way a stream ends settles its call once:

- read to the end: commit the provider's final usage;
- the consumer stops early (``break`` out of the loop, ``close()``, leaving ``with``, garbage
  collection, a cancelled task): close the upstream response at once, so the provider stops
  generating, and commit what was produced (counted from the deltas);
- a kill switch covering the call is tripped: noticed within about ``switch_check_seconds``,
  at a chunk or while a read waits (async: the read races the next look; sync: the process's
  watchdog thread looks and shuts the stalled stream's socket down); close upstream, commit what
  was produced, raise ``KillSwitchActive``;
- the connection breaks, a read times out or the provider sends an error event: close upstream,
  mark the hold uncertain, re-raise the SDK's error.

A ``break`` out of ``for chunk in stream`` is seen at once in CPython: the loop's iterator (a
generator delegating with ``yield from``) is closed when the loop drops it. For ``async for`` the
event loop closes it soon after (asyncio's async-generator finaliser); ``async with`` or
``await stream.close()`` closes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from asgiref.sync import sync_to_async
from django import db

from llm_budgets.exceptions import KillSwitchActive
from llm_budgets.integrations.guarding import Call, retry_delay
from llm_budgets.integrations.headers import check_call
from llm_budgets.integrations.transport import sending
from llm_budgets.usage import Usage

logger = logging.getLogger("llm_budgets")

# Counts an event; returns False for an event the caller did not ask for (it is not passed on).
Observe = Callable[[Call, Any], bool | None]
# The shortest wait between two looks for a kill switch while an async stream is stalled.
STALL_POLL_SECONDS = 0.05
# The watchdog thread ends after this long without a stream to watch.
WATCHDOG_IDLE_SECONDS = 30.0


@dataclass(frozen=True)
class Sdk:
    """What sending needs to know of an SDK: its stream classes, their guarded subclasses, and
    how to read usage from a whole response (``usage(response)``)."""

    stream: type
    async_stream: type
    guarded_stream: type[SyncStreamGuard]
    async_guarded_stream: type[AsyncStreamGuard]
    usage: Callable[[object], Usage | None]
    # Notes what an answer says of its own billing (e.g. the service tier it was served at).
    note: Callable[[Call, object], None] = lambda call, answer: None


Pin = Callable[[Call, dict[str, Any]], dict[str, Any]]


def send(
    sdk: Sdk, method: Any, call: Call, kwargs: dict[str, Any], pin: Pin, observe: Observe
) -> Any:
    """Admit, then call ``method`` with ``kwargs`` pinned to what was held (``pin``: the model
    and ceiling granted), and settle its answer, or return its stream guarded. A failed attempt
    the SDK would retry is settled on its own and retried under a new hold (``retry_delay``)."""
    check_call(method, kwargs, call)
    attempt = 0
    while True:
        call.admit()
        try:
            with sending(call):
                result = method(**pin(call, kwargs))
        except BaseException as exc:
            _settle_failure(sdk, call, exc)
            delay = retry_delay(exc, attempt=attempt, call=call)
            if delay is None:
                raise
            time.sleep(delay)
            attempt, call = attempt + 1, call.fresh()
            continue
        return _settle_answer(sdk, call, result, observe, sdk.stream, sdk.guarded_stream)


async def asend(
    sdk: Sdk, method: Any, call: Call, kwargs: dict[str, Any], pin: Pin, observe: Observe
) -> Any:
    """``send`` for async clients (the ledger is reached through ``sync_to_async``)."""
    check_call(method, kwargs, call)
    attempt = 0
    while True:
        await call.aadmit()
        try:
            with sending(call):
                result = await method(**pin(call, kwargs))
        except BaseException as exc:
            await sync_to_async(_settle_failure)(sdk, call, exc)
            delay = retry_delay(exc, attempt=attempt, call=call)
            if delay is None:
                raise
            await asyncio.sleep(delay)
            attempt, call = attempt + 1, call.fresh()
            continue
        if isinstance(result, sdk.async_stream):
            return _settle_answer(
                sdk, call, result, observe, sdk.async_stream, sdk.async_guarded_stream
            )
        return await sync_to_async(_settle_answer)(
            sdk, call, result, observe, sdk.async_stream, sdk.async_guarded_stream
        )


def _settle_failure(sdk: Sdk, call: Call, exc: BaseException) -> None:
    answered = _answer_in(exc)
    if answered is not None:
        sdk.note(call, answered)
        call.succeeded(sdk.usage(answered))
    call.failed(exc)


def _settle_answer(
    sdk: Sdk, call: Call, result: Any, observe: Observe, stream: type, guarded: type
) -> Any:
    """A stream, returned guarded (settled as it ends); any other answer, settled now."""
    if isinstance(result, stream):
        call.streamed = True
        return guarded(result, call=call, observe=observe)
    sdk.note(call, result)
    call.succeeded(sdk.usage(result))
    return result


def _answer_in(exc: BaseException) -> Any:
    """The provider's answer an SDK error carries (OpenAI's ``LengthFinishReasonError`` and
    ``ContentFilterFinishReasonError`` keep the ``completion``, with its usage): then the call
    is charged what it used, not left uncertain."""
    answered = getattr(exc, "completion", None)
    return answered if getattr(answered, "usage", None) is not None else None


class _Watchdog:
    """One daemon thread per process that looks for kill switches on behalf of sync streams
    stalled in a read (a read blocks its thread, so the stream cannot look itself). Every
    ``STALL_POLL_SECONDS`` it checks each stream waiting for a chunk whose last look is older
    than its ``switch_check_seconds`` (one indexed query each, on the watchdog's own database
    connection, closed after each round); a stream with chunks flowing looks for itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, SyncStreamGuard] = {}
        self._thread: threading.Thread | None = None

    def waiting(self, stream: SyncStreamGuard) -> None:
        with self._lock:
            self._waiting[id(stream)] = stream
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="llm_budgets stream watchdog", daemon=True
                )
                self._thread.start()

    def done(self, stream: SyncStreamGuard) -> None:
        with self._lock:
            self._waiting.pop(id(stream), None)

    def _loop(self) -> None:
        idle = 0
        while True:
            time.sleep(STALL_POLL_SECONDS)
            with self._lock:
                idle = 0 if self._waiting else idle + 1
                if idle * STALL_POLL_SECONDS >= WATCHDOG_IDLE_SECONDS:
                    self._thread = None  # the next waiting stream starts another
                    return
                due = [s for s in self._waiting.values() if s._call.switch_check_due()]
            if not due:
                continue
            try:
                for stream in due:
                    refusal = stream._call.check_switches(force=True)
                    if refusal is not None:
                        stream._trip(refusal)
            except Exception:
                logger.exception("llm_budgets: the stream watchdog could not read kill switches.")
            finally:
                db.connection.close()


WATCHDOG = _Watchdog()


class _StreamGuard:
    response: Any

    def __init__(self, inner: Any, *, call: Call, observe: Observe) -> None:
        self._inner = inner
        self._call = call
        self._observe = observe
        self.response = inner.response
        self._events = self._run()

    def _run(self) -> Any:
        raise NotImplementedError

    @property
    def hold(self) -> Any:
        """The reservation's ``Hold``."""
        return self._call.hold


class SyncStreamGuard(_StreamGuard):
    """Mixed in before the SDK's ``Stream``: ``GuardedStream(inner, call=..., observe=...)``."""

    _tripped: KillSwitchActive | None = None

    def _run(self) -> Generator[Any, None, None]:
        call = self._call
        stopped_by: KillSwitchActive | None = None
        events = iter(self._inner)
        try:
            while True:
                WATCHDOG.waiting(self)
                try:
                    event = next(events)
                except StopIteration:
                    break
                finally:
                    WATCHDOG.done(self)
                shown = self._observe(call, event) is not False
                stopped_by = self._tripped or call.check_switches()
                if stopped_by is not None:
                    break
                if shown:
                    yield event
        except GeneratorExit:
            self._inner.close()
            call.stopped()
            raise
        except BaseException as exc:
            self._inner.close()
            if self._tripped is not None:  # the watchdog cut a stalled read
                call.stopped()
                raise self._tripped from exc
            call.lost(exc)
            raise
        if stopped_by is not None:
            self._inner.close()
            call.stopped()
            raise stopped_by
        call.succeeded(call.final_usage)

    def _trip(self, refusal: KillSwitchActive) -> None:
        """From the watchdog's thread: a switch covers this stalled stream. Shut the connection
        down (``close()`` from another thread would not wake the blocked read); the reading
        thread then settles and raises the refusal."""
        self._tripped = refusal
        stream = self.response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            logger.warning(
                "llm_budgets: no socket to cut for a stalled stream; it ends at its timeout."
            )
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def __next__(self) -> Any:
        return next(self._events)

    def __iter__(self) -> Iterator[Any]:
        # ``yield from`` closes ``_events`` when this generator is closed (a ``break``).
        yield from self._events

    def close(self) -> None:
        """Close upstream and settle on what was produced (idempotent)."""
        self._events.close()
        self._inner.close()
        self._call.stopped()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncStreamGuard(_StreamGuard):
    """Mixed in before the SDK's ``AsyncStream``."""

    async def _run(self) -> AsyncGenerator[Any, None]:
        call = self._call
        stopped_by: KillSwitchActive | None = None
        events = self._inner.__aiter__()
        try:
            while stopped_by is None:
                got, event, stopped_by = await self._next_or_switch(events)
                if not got or stopped_by is not None:
                    break
                shown = self._observe(call, event) is not False
                if call.switch_check_due():
                    stopped_by = await sync_to_async(call.check_switches)(force=True)
                if stopped_by is None and shown:
                    yield event
        except GeneratorExit:
            await self._inner.close()
            await sync_to_async(call.stopped)()
            raise
        except asyncio.CancelledError:
            # The consumer's task was cancelled while waiting for a chunk: it stopped early.
            await self._inner.close()
            await sync_to_async(call.stopped)()
            raise
        except BaseException as exc:
            await self._inner.close()
            await sync_to_async(call.lost)(exc)
            raise
        if stopped_by is not None:
            await self._inner.close()
            await sync_to_async(call.stopped)()
            raise stopped_by
        await sync_to_async(call.succeeded)(call.final_usage)

    async def _next_or_switch(
        self, events: AsyncIterator[Any]
    ) -> tuple[bool, Any, KillSwitchActive | None]:
        """The next event (``(True, event, None)``, or ``(False, None, None)`` at the end), while
        looking for a kill switch every ``switch_check_seconds`` as long as none comes: a stalled
        stream is stopped within the bound too. A switch found cancels the read."""
        call = self._call
        read = asyncio.ensure_future(events.__anext__())
        try:
            while True:
                due = call.options.switch_check_seconds - call.seconds_since_check()
                done, _ = await asyncio.wait({read}, timeout=max(due, STALL_POLL_SECONDS))
                if done:
                    break
                stopped_by = await sync_to_async(call.check_switches)(force=True)
                if stopped_by is not None:
                    read.cancel()
                    with contextlib.suppress(BaseException):
                        await read
                    return False, None, stopped_by
        except BaseException:
            read.cancel()
            with contextlib.suppress(BaseException):
                await read
            raise
        try:
            return True, read.result(), None
        except StopAsyncIteration:
            return False, None, None

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for event in self._events:
                yield event
        finally:
            await self._events.aclose()

    async def close(self) -> None:
        """Close upstream and settle on what was produced (idempotent)."""
        await self._events.aclose()
        await self._inner.close()
        if not self._call.settled:
            await sync_to_async(self._call.stopped)()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.close()
