"""A set read from the database at most every ``ttl`` seconds per process: the cheap checks that
keep a commit or an event from querying for the common "no" (which tenants are linked to Stripe,
which have an auto-recharge rule, which event types an endpoint subscribes to).

A change made in another process is seen here within ``ttl``; each user of a set says why that
staleness is harmless. :meth:`CachedSet.clear` makes this process read it again (its own changes;
tests, whose rollbacks let ids repeat)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class CachedSet(Generic[T]):
    def __init__(self, ttl: float, read: Callable[[], Iterable[T]]) -> None:
        self.ttl = ttl
        self._read = read
        self._kept: tuple[float, frozenset[T]] | None = None
        self._lock = threading.Lock()

    def get(self) -> frozenset[T]:
        now = time.monotonic()
        kept = self._kept
        if kept is None or now - kept[0] > self.ttl:
            values = frozenset(self._read())
            with self._lock:
                self._kept = kept = (now, values)
        return kept[1]

    def keep(self, values: Iterable[T]) -> None:
        """Keep ``values`` as if just read (a test standing in for another process's stale set)."""
        with self._lock:
            self._kept = (time.monotonic(), frozenset(values))

    def clear(self) -> None:
        with self._lock:
            self._kept = None
