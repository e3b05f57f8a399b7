"""Per-key throttling (DRF throttle) at ``LLM_BUDGETS["API_THROTTLE_RATE"]``."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from llm_budgets.conf import conf
from llm_budgets.models import ApiKey


class ApiKeyRateThrottle(SimpleRateThrottle):
    scope = "llm_budgets"

    def get_rate(self) -> str | None:
        return conf.API_THROTTLE_RATE

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, ApiKey):
            return None  # unauthenticated requests are refused before throttling matters
        return f"llm_budgets:throttle:{request.auth.prefix}"
