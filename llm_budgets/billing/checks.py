"""System checks of the Stripe settings (ids ``llm_budgets.E050``-``E057``, ``W050``)."""

from __future__ import annotations

import re
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from llm_budgets.conf import STRIPE_PAYMENT_FAILED_ACTIONS, conf


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def stripe_settings_errors(values: dict[str, Any]) -> list[CheckMessage]:
    """The Stripe keys of ``LLM_BUDGETS`` (``values``: the defaults merged with the host's)."""
    errors: list[CheckMessage] = []
    key = values["STRIPE_API_KEY"]
    if key is not None and not (isinstance(key, str) and re.fullmatch(r"(sk|rk)_\w+", key)):
        errors.append(
            Error(
                "LLM_BUDGETS['STRIPE_API_KEY'] must be None or a Stripe secret or restricted key "
                "(sk_... or rk_...).",
                hint="Got a value of another shape; nothing is sent to Stripe without a key.",
                id="llm_budgets.E050",
            )
        )
    base = values["STRIPE_API_BASE"]
    if not (isinstance(base, str) and re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", base)):
        errors.append(
            Error(
                "LLM_BUDGETS['STRIPE_API_BASE'] must be a base URL such as "
                "'https://api.stripe.com'.",
                hint=f"Got {base!r}.",
                id="llm_budgets.E051",
            )
        )
    name = values["STRIPE_METER_EVENT_NAME"]
    if not (isinstance(name, str) and 0 < len(name) <= 100 and name.strip() == name):
        errors.append(
            Error(
                "LLM_BUDGETS['STRIPE_METER_EVENT_NAME'] must be a non-empty string of at most "
                "100 characters (Stripe's limit), without surrounding spaces.",
                hint=f"Got {name!r}.",
                id="llm_budgets.E052",
            )
        )
    secret = values["STRIPE_WEBHOOK_SECRET"]
    if secret is not None and not (isinstance(secret, str) and secret.startswith("whsec_")):
        errors.append(
            Error(
                "LLM_BUDGETS['STRIPE_WEBHOOK_SECRET'] must be None or the endpoint's signing "
                "secret (whsec_...).",
                hint="Copy it from the webhook endpoint in Stripe's dashboard.",
                id="llm_budgets.E053",
            )
        )
    action = values["STRIPE_ON_PAYMENT_FAILED"]
    if action not in STRIPE_PAYMENT_FAILED_ACTIONS:
        errors.append(
            Error(
                "LLM_BUDGETS['STRIPE_ON_PAYMENT_FAILED'] must be one of "
                f"{', '.join(map(repr, STRIPE_PAYMENT_FAILED_ACTIONS))}.",
                hint=f"Got {action!r}.",
                id="llm_budgets.E054",
            )
        )
    for name_, error_id in (
        ("STRIPE_MAX_ATTEMPTS", "llm_budgets.E055"),
        ("STRIPE_RETRY_BASE_SECONDS", "llm_budgets.E056"),
        ("STRIPE_RECONCILE_DAYS", "llm_budgets.E057"),
    ):
        if not _positive_int(values[name_]):
            errors.append(
                Error(
                    f"LLM_BUDGETS[{name_!r}] must be a positive integer.",
                    hint=f"Got {values[name_]!r}.",
                    id=error_id,
                )
            )
    return errors


@register(Tags.database)
def check_linked_without_key(**kwargs: Any) -> list[CheckMessage]:
    """Warn when tenants are linked to Stripe customers but nothing can be sent."""
    if not kwargs.get("databases") or conf.STRIPE_API_KEY:
        return []
    from llm_budgets.models import StripeCustomerLink

    try:
        linked = StripeCustomerLink.objects.filter(unlinked_at__isnull=True).count()
    except DatabaseError:
        return []  # not migrated yet
    if not linked:
        return []
    return [
        Warning(
            f"{linked} tenant(s) are linked to Stripe customers but "
            "LLM_BUDGETS['STRIPE_API_KEY'] is not set: their usage waits in the outbox and "
            "nothing is sent to Stripe.",
            hint="Set STRIPE_API_KEY (docs/billing.md), or unlink the tenants.",
            id="llm_budgets.W050",
        )
    ]
