"""Who may call what: any valid key, or only an operator (tenant-less) key."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from llm_budgets.models import ApiKey


class HasApiKey(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, ApiKey)


class IsOperatorKey(BasePermission):
    message = "This endpoint needs an operator API key; tenant keys cannot change budgets."
    code = "operator_key_required"

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, ApiKey) and request.auth.is_operator
