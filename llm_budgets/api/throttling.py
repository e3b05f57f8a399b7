"""Throttles of the REST API, counted in the database so that every web process counts against
the same number (Django's default cache is per process unless the host shares one):

- per API key, at ``LLM_BUDGETS["API_THROTTLE_RATE"]`` (a DRF throttle class);
- failed authentications per source (``source_of``), at ``LLM_BUDGETS["API_AUTH_FAILURE_RATE"]``:
  once a source has failed that often in the window, every attempt from it is refused (429 with
  Retry-After) before its key is even looked at, until the window ends;
- a known key presented with its right secret but revoked or expired counts against that key
  instead (``key_failure_record``), at the same rate: 429 for that key alone.

Fixed windows (``RateCounter`` rows), one upsert per counted request; a burst of up to twice the
rate can straddle a window boundary. Old windows are deleted as new ones start.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.models import ApiKey, RateCounter

DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Counters of windows that started this long ago are deleted (more than the longest window).
STALE_AFTER = 2 * 86400


def parse_rate(rate: str) -> tuple[int, int]:
    """``"600/minute"`` as (600 requests, 60 seconds)."""
    count, period = rate.split("/")
    return int(count), DURATIONS[period[0]]


def _window(duration: int, now: float) -> int:
    return int(now // duration) * duration


def window_now(duration: int) -> int:
    """The start of the current window of this duration."""
    return _window(duration, time.time())


def counter_hit(key: str, *, duration: int, now: float | None = None) -> int:
    """Count one hit of ``key`` in the current window; returns the window's hits so far. One
    statement (an upsert), so concurrent processes never lose a hit."""
    start = _window(duration, time.time() if now is None else now)
    table = connection.ops.quote_name(RateCounter._meta.db_table)
    with connection.cursor() as cursor:
        upsert = (
            f'INSERT INTO {table} ("key", window_start, hits) VALUES (%s, %s, 1) '  # noqa: S608
            f'ON CONFLICT ("key", window_start) DO UPDATE SET hits = {table}.hits + 1 '
            "RETURNING hits"
        )
        cursor.execute(upsert, [key, start])
        hits = int(cursor.fetchone()[0])
    if hits == 1:
        forget_old_windows(key, start)
    return hits


def forget_old_windows(key: str, start: int) -> None:
    """On a new window of ``key``: delete its old ones, and anyone's older than STALE_AFTER."""
    table = connection.ops.quote_name(RateCounter._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f'DELETE FROM {table} WHERE ("key" = %s AND window_start < %s) '  # noqa: S608
            "OR window_start < %s",
            [key, start, start - STALE_AFTER],
        )


def counter_hits(key: str, *, duration: int, now: float | None = None) -> int:
    """Hits of ``key`` in the current window, without counting one."""
    start = _window(duration, time.time() if now is None else now)
    table = connection.ops.quote_name(RateCounter._meta.db_table)
    with connection.cursor() as cursor:  # every request: one statement, no ORM compilation
        cursor.execute(
            f'SELECT hits FROM {table} WHERE "key" = %s AND window_start = %s',  # noqa: S608
            [key, start],
        )
        row = cursor.fetchone()
    return 0 if row is None else int(row[0])


def seconds_left(duration: int, now: float | None = None) -> int:
    current = time.time() if now is None else now
    return max(1, int(_window(duration, current) + duration - current + 0.999))


def source_of(request: Request) -> str:
    """The client's address: ``REMOTE_ADDR``, or with ``TRUSTED_PROXIES`` n > 0 the n-th
    X-Forwarded-For entry from the right, the one the farthest trusted proxy wrote. Entries
    left of it are the client's own words and never believed; a header with fewer than n
    entries did not come through every proxy, and counts as ``REMOTE_ADDR``."""
    remote = str(request.META.get("REMOTE_ADDR") or "unknown")
    trusted = conf.TRUSTED_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if trusted == 0 or not forwarded:
        return remote
    entries = [entry.strip() for entry in str(forwarded).split(",")]
    if len(entries) < trusted:
        return remote
    return entries[-trusted] or remote


def auth_failure_key(request: Request) -> str:
    return f"auth-failures:{source_of(request)}"[:200]


def auth_blocked_for(request: Request) -> int | None:
    """Seconds until this source may try again, or None if it may try now."""
    return auth_wait(auth_failures_counted(request))


def auth_failures_counted(request: Request) -> int | None:
    """This source's failed attempts in the current window (None: API_AUTH_FAILURE_RATE off)."""
    rate = conf.API_AUTH_FAILURE_RATE
    if rate is None:
        return None
    _limit, duration = parse_rate(rate)
    with ledger_guard("authentication"):
        return counter_hits(auth_failure_key(request), duration=duration)


def auth_wait(failures: int | None) -> int | None:
    """Seconds until a source with this many failures may try again, or None if it may now."""
    rate = conf.API_AUTH_FAILURE_RATE
    if rate is None or failures is None:
        return None
    limit, duration = parse_rate(rate)
    return None if failures < limit else seconds_left(duration)


def key_counter(prefix: str) -> str:
    """The counter of the per-key throttle."""
    return f"api-key:{prefix}"


def auth_failure_record(request: Request) -> None:
    rate = conf.API_AUTH_FAILURE_RATE
    if rate is None:
        return
    _limit, duration = parse_rate(rate)
    with ledger_guard("authentication"):
        counter_hit(auth_failure_key(request), duration=duration)


def key_failure_record(prefix: str) -> int | None:
    """A known key, its secret right, refused as revoked or expired: counted against the key, not
    its source, so one misconfigured service cannot lock every key behind a shared address out.
    Returns the seconds until the key may try again once it is over ``API_AUTH_FAILURE_RATE``,
    else None."""
    rate = conf.API_AUTH_FAILURE_RATE
    if rate is None:
        return None
    limit, duration = parse_rate(rate)
    with ledger_guard("authentication"):
        hits = counter_hit(f"refused-key:{prefix}", duration=duration)
    return seconds_left(duration) if hits > limit else None


class ApiKeyRateThrottle(BaseThrottle):
    """At most ``API_THROTTLE_RATE`` requests per API key, across every process."""

    def __init__(self) -> None:
        self.wait_seconds: int | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        rate = conf.API_THROTTLE_RATE
        if rate is None or not isinstance(request.auth, ApiKey):
            return True  # unauthenticated requests are refused before throttling matters
        limit, duration = parse_rate(rate)
        counted = getattr(request, "_llmb_key_hits", None)
        if counted is not None and counted[0] == key_counter(request.auth.prefix):
            hits = counted[2]  # authentication counted it, in its one statement
        else:
            with ledger_guard("throttle"):
                hits = counter_hit(key_counter(request.auth.prefix), duration=duration)
        if hits <= limit:
            return True
        self.wait_seconds = seconds_left(duration)
        return False

    def wait(self) -> float | None:
        return self.wait_seconds
