"""``Authorization: Api-Key <prefix>.<secret>`` (the djangorestframework-api-key convention).

Strict: the scheme is written exactly ``Api-Key``, one space, then the key, nothing else. Every
attempt that does not authenticate counts against its source (``throttling.auth_blocked_for``);
a source over ``API_AUTH_FAILURE_RATE`` is refused with 429 before its key is looked at. An
unknown prefix costs the same hash comparison as a known one, so timing does not tell which
prefixes exist; the comparison itself is constant-time (the key generator's ``verify``).
Revocation and expiry are read from the database on every request, effective on the next one,
unless the host opts into ``API_KEY_CACHE_SECONDS`` (each process then keeps key rows that long).
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db.models.signals import post_delete, post_save
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from llm_budgets.api import throttling
from llm_budgets.conf import conf
from llm_budgets.engine import statements as sql
from llm_budgets.engine.boundary import ledger_guard
from llm_budgets.models import ApiKey, Tenant

KEYWORD = "Api-Key"
_HEADER = re.compile(rf"{KEYWORD} ([A-Za-z0-9]{{1,64}})\.([A-Za-z0-9]{{1,128}})")


_clock = time.monotonic
_keys: dict[str, tuple[float, ApiKey | None]] = {}
"""With API_KEY_CACHE_SECONDS > 0: key rows by prefix (None: no such prefix), each until its
deadline, so most requests need no database read to authenticate. Saving or deleting a key or a
tenant clears it in this process; elsewhere a change is seen within API_KEY_CACHE_SECONDS."""
_MAX_CACHED = 10_000  # a flood of made-up prefixes empties the cache rather than filling memory


def _key_with_prefix(prefix: str) -> ApiKey | None:
    ttl = conf.API_KEY_CACHE_SECONDS
    now = _clock()
    cached = _keys.get(prefix) if ttl > 0 else None
    if cached is not None and cached[0] > now:
        return cached[1]
    api_key = _key_row(prefix)
    if ttl > 0:
        if len(_keys) >= _MAX_CACHED:
            _keys.clear()
        _keys[prefix] = (now + ttl, api_key)
    return api_key


def _key_row(prefix: str) -> ApiKey | None:
    """The key with this prefix and its tenant: one statement by the unique prefix, without the
    ORM's compilation (``llm_budgets.engine.statements``): it runs on every request."""
    rows = sql.fetch(_key_row_sql(), [prefix])
    if not rows:
        return None
    api_key = sql.row_to(ApiKey, rows[0])
    tenant_id = rows[0][sql.width(ApiKey)]
    api_key.tenant = None if tenant_id is None else sql.row_to(Tenant, rows[0], sql.width(ApiKey))
    return api_key


@functools.cache
def _key_row_sql() -> str:
    return (
        f"SELECT {sql.columns(ApiKey, 'k')}, {sql.columns(Tenant, 't')}"  # noqa: S608
        f" FROM {sql.table(ApiKey)} k"
        f" LEFT JOIN {sql.table(Tenant)} t ON t.id = k.{sql.column(ApiKey, 'tenant')}"
        f" WHERE k.{sql.column(ApiKey, 'prefix')} = %s"
    )


def _forget_keys(**kwargs: Any) -> None:
    _keys.clear()


for _model in (ApiKey, Tenant):
    post_save.connect(_forget_keys, sender=_model, dispatch_uid=f"llmb_forget_keys_{_model}")
    post_delete.connect(_forget_keys, sender=_model, dispatch_uid=f"llmb_forget_keys_d{_model}")


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
        wait = throttling.auth_blocked_for(request)
        if wait is not None:
            raise exceptions.Throttled(
                wait,
                detail=f"Too many failed API key attempts from this address; retry in {wait} "
                "seconds.",
            )
        try:
            return AnonymousUser(), self._key(header)
        except exceptions.AuthenticationFailed:
            throttling.auth_failure_record(request)
            raise

    def _key(self, header: str) -> ApiKey:
        match = _HEADER.fullmatch(header)
        if match is None:
            raise exceptions.AuthenticationFailed(
                f"Malformed Authorization header: send exactly '{KEYWORD} <prefix>.<secret>' "
                "(this spelling, one space, no other text).",
                code="malformed_api_key",
            )
        raw = match.group(0).removeprefix(f"{KEYWORD} ")
        with ledger_guard("authentication"):
            api_key = _key_with_prefix(match[1])
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
