"""Alert checks (docs/alerts.md): plain HTTP and private addresses are for development only.

``llm_budgets.E110``: ``ALERTS_ALLOW_HTTP`` outside DEBUG (deliveries, secrets in signatures and
the events themselves would cross the network in clear). ``llm_budgets.W111``:
``ALERTS_ALLOWED_ADDRESSES`` outside DEBUG (endpoints may then reach those internal addresses).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register


@register(Tags.security)
def check_alerts_production(**kwargs: Any) -> list[CheckMessage]:
    from llm_budgets.checks import setting_or

    if settings.DEBUG:
        return []
    found: list[CheckMessage] = []
    if setting_or("ALERTS_ALLOW_HTTP", False) is True:
        found.append(
            Error(
                "LLM_BUDGETS['ALERTS_ALLOW_HTTP'] is True outside DEBUG: alert endpoints may use "
                "plain http://, in clear.",
                hint="Remove it in production; endpoints must use https:// (docs/alerts.md).",
                id="llm_budgets.E110",
            )
        )
    allowed = setting_or("ALERTS_ALLOWED_ADDRESSES", [])
    if allowed:
        found.append(
            Warning(
                f"LLM_BUDGETS['ALERTS_ALLOWED_ADDRESSES'] lets alert endpoints reach "
                f"{', '.join(allowed)} outside DEBUG.",
                hint="Keep it for tests and local receivers; anyone who can create an endpoint "
                "can make the server call those addresses.",
                id="llm_budgets.W111",
            )
        )
    return found
