"""``Authorization: Api-Key <prefix>.<secret>`` (the djangorestframework-api-key convention).

Strict: the scheme is written exactly ``Api-Key``, one space, then the key, nothing else. Every
attempt that does not authenticate counts against its source (``throttling.auth_blocked_for``),
but a revoked or expired key with its right secret counts against that key (``_KEY_REFUSALS``);
a source over ``API_AUTH_FAILURE_RATE`` is refused with 429 before its key's secret is checked
(the key row is read by the same statement as the source's count: ``auth_read``). An
unknown prefix costs the same hash comparison as a known one, so timing does not tell which
prefixes exist; the comparison itself is constant-time (the key generator's ``verify``).
Revocation and expiry are read from the database on every request, effective on the next one,
unless the host opts into ``API_KEY_CACHE_SECONDS`` (each process then keeps key rows that long).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.db.models.signals import post_delete, post_save
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework_api_key.crypto import Sha512ApiKeyHasher

from llm_budgets.api import throttling
from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.models import ApiKey, RateCounter, Reservation, Tenant

KEYWORD = "Api-Key"
_HEADER = re.compile(rf"{KEYWORD} ([A-Za-z0-9]{{1,64}})\.([A-Za-z0-9]{{1,128}})")


_clock = time.monotonic
_keys: dict[str, tuple[float, ApiKey | None]] = {}
"""With API_KEY_CACHE_SECONDS > 0: key rows by prefix (None: no such prefix), each until its
deadline, so most requests need no database read to authenticate. Saving or deleting a key or a
tenant clears it in this process; elsewhere a change is seen within API_KEY_CACHE_SECONDS."""
_MAX_CACHED = 10_000  # a flood of made-up prefixes empties the cache rather than filling memory


def _from_cache(prefix: str) -> tuple[ApiKey | None] | None:
    """With API_KEY_CACHE_SECONDS on, this prefix's cached row until its deadline, as a 1-tuple
    (its key, or None: no such prefix); None if it is not cached (then authentication reads it
    with the source's failures: ``auth_read``)."""
    if conf.API_KEY_CACHE_SECONDS <= 0:
        return None
    cached = _keys.get(prefix)
    return (cached[1],) if cached is not None and cached[0] > _clock() else None


def _to_cache(prefix: str, api_key: ApiKey | None) -> ApiKey | None:
    ttl = conf.API_KEY_CACHE_SECONDS
    if ttl > 0:
        if len(_keys) >= _MAX_CACHED:
            _keys.clear()
        _keys[prefix] = (_clock() + ttl, api_key)
    return api_key


def _key_from_row(row: Sequence[Any], at: int) -> ApiKey | None:
    """The key at ``row[at:]`` with its tenant after it (None for an operator key), or None where
    no key has the prefix."""
    api_key = sql.row_to_or_none(ApiKey, row, at)
    if api_key is not None:
        api_key.tenant = sql.row_to_or_none(Tenant, row, at + sql.width(ApiKey))
    return api_key


@dataclasses.dataclass(frozen=True)
class AuthRead:
    api_key: ApiKey | None
    failures: int | None  # this source's failed attempts in the window (None: not counted)
    key_hits: tuple[str, int, int] | None  # (counter key, window start, hits) if counted here
    reservation: tuple[str, bool] | None  # (the URL's reservation id, visible to the key)


def auth_read(request: Request, prefix: str, raw: str) -> AuthRead:
    """Everything authentication and the per-request checks read, in one statement:

    - the key with this prefix and its tenant;
    - this source's failed attempts in the current window (``API_AUTH_FAILURE_RATE``);
    - on PostgreSQL, the key's hit for ``API_THROTTLE_RATE``, counted by a data-modifying
      ``WITH`` only if the stored hash equals the presented key's (so a wrong secret never uses
      up a key's quota) and the source is not blocked: the upsert ``counter_hit`` runs;
    - with a view that names one (``prefetch_reservation``), whether the reservation in the
      URL exists and the key may see it (a read: nothing is locked or changed).
    """
    failure_rate = conf.API_AUTH_FAILURE_RATE
    throttle_rate = conf.API_THROTTLE_RATE
    failures = None
    if failure_rate is not None:
        limit, duration = throttling.parse_rate(failure_rate)
        failures = (throttling.auth_failure_key(request), throttling.window_now(duration), limit)
    hit = None
    hasher = ApiKey.objects.key_generator.preferred_hasher
    # The hit is counted in SQL only where the stored hash can be recomputed there: the default
    # unsalted SHA-512. A host's salted hasher counts it after the secret check, in its own
    # statement (as SQLite does).
    if (
        throttle_rate is not None
        and connection.vendor == "postgresql"
        and isinstance(hasher, Sha512ApiKeyHasher)
        and _throttled(request)
    ):
        _limit, duration = throttling.parse_rate(throttle_rate)
        hit = (throttling.key_counter(prefix), throttling.window_now(duration))
    reservation = _prefetched_reservation(request)
    params: list[Any] = []
    if hit is not None:
        params += [*hit, prefix, hasher.encode(raw, "")]
        if failures is not None:
            params += list(failures)
    if failures is not None:
        params += list(failures[:2])
    if reservation is not None:
        params.append(sql.param(Reservation, "id", reservation[1]))
    params.append(prefix)
    text = _auth_sql(
        failures=failures is not None,
        hit=hit is not None,
        reservation=reservation is not None,
        # Its own transaction (autocommit): the counter's commit need not wait for the WAL
        # flush. Never inside a host's transaction (ATOMIC_REQUESTS), which may hold ledger rows.
        async_commit=hit is not None and connection.get_autocommit(),
    )
    row = sql.fetch(text, params)[0]
    key_hits = None
    if hit is not None and row[1] is not None:
        key_hits = (*hit, int(row[1]))
        if key_hits[2] == 1:  # a new window: forget old ones, as counter_hit does
            throttling.forget_old_windows(*hit)
    return AuthRead(
        api_key=_key_from_row(row, 3),  # after the failures, the hit and the reservation
        failures=None if failures is None else int(row[0] or 0),
        key_hits=key_hits,
        reservation=None if reservation is None else (reservation[0], row[2] is not None),
    )


def _throttled(request: Request) -> bool:
    """Whether the view counts requests with the per-key throttle (else nothing is counted)."""
    view = (getattr(request, "parser_context", None) or {}).get("view")
    return throttling.ApiKeyRateThrottle in getattr(view, "throttle_classes", ())


def _prefetched_reservation(request: Request) -> tuple[str, UUID] | None:
    context = getattr(request, "parser_context", None) or {}
    name = getattr(context.get("view"), "prefetch_reservation", None)
    value = (context.get("kwargs") or {}).get(name) if name else None
    if not isinstance(value, str):
        return None
    try:
        return value, UUID(value)
    except ValueError:
        return None  # the view answers 404 itself


@functools.cache
def _auth_sql(*, failures: bool, hit: bool, reservation: bool, async_commit: bool) -> str:
    counters = sql.table(RateCounter)
    key_table = sql.table(ApiKey)
    prefix, hashed = sql.column(ApiKey, "prefix"), sql.column(ApiKey, "hashed_key")
    unblocked = (
        f' AND NOT EXISTS (SELECT 1 FROM {counters} WHERE "key" = %s AND window_start = %s'  # noqa: S608
        " AND hits >= %s)"
        if failures
        else ""
    )
    with_hit = (
        f'WITH hit AS (INSERT INTO {counters} ("key", window_start, hits)'  # noqa: S608
        f" SELECT %s, %s, 1 FROM {key_table} WHERE {prefix} = %s AND {hashed} = %s{unblocked}"
        f' ON CONFLICT ("key", window_start) DO UPDATE SET hits = {counters}.hits + 1'
        " RETURNING hits) "
        if hit
        else ""
    )
    failures_col = (
        f'(SELECT hits FROM {counters} WHERE "key" = %s AND window_start = %s)'  # noqa: S608
        if failures
        else "NULL"
    )
    tenant_col = f"k.{sql.column(ApiKey, 'tenant')}"
    # A throttle hit lost to a crash of PostgreSQL in the last moment before it (at most three
    # wal_writer_delay) is harmless; waiting for the WAL flush on every request is not.
    one = "SELECT set_config('synchronous_commit', 'off', true)" if async_commit else "SELECT 1"
    reservation_col = (
        f"(SELECT r.id FROM {sql.table(Reservation)} r WHERE r.id = %s"  # noqa: S608
        f" AND k.{sql.column(ApiKey, 'id')} IS NOT NULL"
        f" AND ({tenant_col} IS NULL OR r.{sql.column(Reservation, 'tenant')} = {tenant_col}))"
        if reservation
        else "NULL"
    )
    return (
        f"{with_hit}SELECT {failures_col}, {'(SELECT hits FROM hit)' if hit else 'NULL'},"  # noqa: S608
        f" {reservation_col}, {sql.columns(ApiKey, 'k')}, {sql.columns(Tenant, 't')}"
        f" FROM ({one}) one LEFT JOIN {key_table} k ON k.{prefix} = %s"
        f" LEFT JOIN {sql.table(Tenant)} t ON t.id = {tenant_col}"
    )


def _forget_keys(**kwargs: Any) -> None:
    _keys.clear()


def key_cache_watch() -> None:
    """Connect the receivers that empty this process's key cache when a key or a tenant is saved
    or deleted (``AppConfig.ready``)."""
    for model in (ApiKey, Tenant):
        post_save.connect(_forget_keys, sender=model, dispatch_uid=f"llmb_forget_keys_{model}")
        post_delete.connect(_forget_keys, sender=model, dispatch_uid=f"llmb_forget_keys_d{model}")


# Refusals of a known key with its right secret: counted per key, not per source.
_KEY_REFUSALS = ("api_key_revoked", "api_key_expired")


@functools.cache
def _decoy_hash() -> str:
    """A hash to compare against when the prefix is unknown (same cost as a real check)."""
    return ApiKey.objects.key_generator.hash("decoyKey.decoySecret")


class ApiKeyAuthentication(BaseAuthentication):
    """Authenticates the request as an :class:`ApiKey` (``request.auth``); no Django user."""

    def authenticate(self, request: Request) -> tuple[AnonymousUser, ApiKey] | None:
        header = request._request.META.get("HTTP_AUTHORIZATION")
        if header is None:
            return None  # NotAuthenticated (401) follows from the permission check.
        match = _HEADER.fullmatch(header)
        try:
            cached = None if match is None else _from_cache(match[1])
            if match is None or cached is not None:
                self._refuse_if_blocked(request, throttling.auth_failures_counted(request))
                return AnonymousUser(), self._key(match, None if cached is None else cached[0])
            return AnonymousUser(), self._key_in_one_read(request, match)
        except exceptions.AuthenticationFailed as failed:
            if match is not None and failed.get_codes() in _KEY_REFUSALS:
                wait = throttling.key_failure_record(match[1])
                if wait is not None:
                    raise exceptions.Throttled(
                        wait,
                        detail=f"Too many attempts with API key {match[1]}, which is revoked or "
                        f"expired; retry in {wait} seconds (with a valid key: now).",
                    ) from None
            else:
                throttling.auth_failure_record(request)
            raise

    def _key_in_one_read(self, request: Request, match: re.Match[str]) -> ApiKey:
        """One statement reads the key, this source's failed attempts, the tenant's view of a
        reservation the URL names, and (PostgreSQL) counts the key's hit for its throttle if
        the secret's hash matches; each result is only acted on in the order a statement each
        would have been: the source's block first, then the secret (constant-time), then the
        rest."""
        raw = match.group(0).removeprefix(f"{KEYWORD} ")
        with ledger_guard("authentication"):
            found = auth_read(request, match[1], raw)
        self._refuse_if_blocked(request, found.failures)
        api_key = self._key(match, _to_cache(match[1], found.api_key))
        if found.key_hits is not None:
            request._llmb_key_hits = found.key_hits  # type: ignore[attr-defined]
        request._llmb_reservation = found.reservation  # type: ignore[attr-defined]
        return api_key

    @staticmethod
    def _refuse_if_blocked(request: Request, failures: int | None) -> None:
        wait = throttling.auth_wait(failures)
        if wait is not None:
            raise exceptions.Throttled(
                wait,
                detail=f"Too many failed API key attempts from this address; retry in {wait} "
                "seconds.",
            )

    def _key(self, match: re.Match[str] | None, api_key: ApiKey | None) -> ApiKey:
        """The key the header names, found (``api_key``: None if no key has its prefix), if
        its secret is right and it is neither revoked nor expired."""
        if match is None:
            raise exceptions.AuthenticationFailed(
                f"Malformed Authorization header: send exactly '{KEYWORD} <prefix>.<secret>' "
                "(this spelling, one space, no other text).",
                code="malformed_api_key",
            )
        raw = match.group(0).removeprefix(f"{KEYWORD} ")
        if api_key is None:
            ApiKey.objects.key_generator.verify(raw, _decoy_hash())
            raise exceptions.AuthenticationFailed("Invalid API key.", code="invalid_api_key")
        if not api_key.is_valid(raw):
            raise exceptions.AuthenticationFailed("Invalid API key.", code="invalid_api_key")
        if api_key.revoked:
            raise exceptions.AuthenticationFailed(
                f"API key {api_key.prefix} was revoked.", code="api_key_revoked"
            )
        if api_key.has_expired:
            raise exceptions.AuthenticationFailed(
                f"API key {api_key.prefix} expired at {api_key.expiry_date:%Y-%m-%d %H:%M} UTC.",
                code="api_key_expired",
            )
        return api_key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate), not 403, when no key was sent.
        return KEYWORD


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "llm_budgets.api.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Api-Key <prefix>.<secret>`, as printed once at creation.",
        }
