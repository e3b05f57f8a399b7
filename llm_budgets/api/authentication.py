"""``Authorization: Api-Key <prefix>.<secret>`` (the djangorestframework-api-key convention)."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db.models.signals import post_delete, post_save
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework_api_key.permissions import KeyParser

from llm_budgets.conf import conf
from llm_budgets.models import ApiKey, Tenant

KEYWORD = "Api-Key"

_clock = time.monotonic
_keys: dict[str, tuple[float, ApiKey | None]] = {}
"""Key rows by prefix (None: no such prefix), each until its deadline: most requests then need
no database read to authenticate. Saving or deleting a key or a tenant clears it in this
process; elsewhere a change is seen within API_KEY_CACHE_SECONDS. Revocation and expiry are
checked on every request against the row, the secret against its hash."""
_MAX_CACHED = 10_000  # a flood of made-up prefixes empties the cache rather than filling memory


def _key_with_prefix(prefix: str) -> ApiKey | None:
    ttl = conf.API_KEY_CACHE_SECONDS
    now = _clock()
    cached = _keys.get(prefix) if ttl > 0 else None
    if cached is not None and cached[0] > now:
        return cached[1]
    api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    if ttl > 0:
        if len(_keys) >= _MAX_CACHED:
            _keys.clear()
        _keys[prefix] = (now + ttl, api_key)
    return api_key


def _forget_keys(**kwargs: Any) -> None:
    _keys.clear()


for _model in (ApiKey, Tenant):
    post_save.connect(_forget_keys, sender=_model, dispatch_uid=f"llmb_forget_keys_{_model}")
    post_delete.connect(_forget_keys, sender=_model, dispatch_uid=f"llmb_forget_keys_d{_model}")


class ApiKeyAuthentication(BaseAuthentication):
    """Authenticates the request as an :class:`ApiKey` (``request.auth``); no Django user."""

    key_parser = KeyParser()

    def authenticate(self, request: Request) -> tuple[AnonymousUser, ApiKey] | None:
        raw = self.key_parser.get(request._request)
        if raw is None:
            return None  # NotAuthenticated (401) follows from the permission check.
        prefix, dot, _secret = raw.strip().partition(".")
        api_key = _key_with_prefix(prefix) if dot else None
        if api_key is None or not api_key.is_valid(raw.strip()):
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
        return AnonymousUser(), api_key

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
