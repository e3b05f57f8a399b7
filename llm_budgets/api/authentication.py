"""``Authorization: Api-Key <prefix>.<secret>`` (the djangorestframework-api-key convention)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework_api_key.permissions import KeyParser

from llm_budgets.models import ApiKey

KEYWORD = "Api-Key"


class ApiKeyAuthentication(BaseAuthentication):
    """Authenticates the request as an :class:`ApiKey` (``request.auth``); no Django user."""

    key_parser = KeyParser()

    def authenticate(self, request: Request) -> tuple[AnonymousUser, ApiKey] | None:
        raw = self.key_parser.get(request._request)
        if raw is None:
            return None  # NotAuthenticated (401) follows from the permission check.
        prefix, dot, _secret = raw.strip().partition(".")
        api_key = (
            ApiKey.objects.select_related("tenant").filter(prefix=prefix).first() if dot else None
        )
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
