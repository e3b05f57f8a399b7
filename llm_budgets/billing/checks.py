"""The Stripe check that reads the database (``llm_budgets.W070``). The settings' own checks
(``E070``-``E077``) are their readers in :mod:`llm_budgets.conf`.

Not tagged ``database``: Django runs those only under ``check --database``, where nobody looks.
It reads the app's own (default) database when that answers, and says nothing when it does not
(not migrated yet, not reachable)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Tags, Warning, register
from django.db import DatabaseError


@register(Tags.compatibility)
def check_linked_without_key(**kwargs: Any) -> list[CheckMessage]:
    """Warn when tenants are linked to Stripe customers but nothing can be sent."""
    from llm_budgets.checks import reads_default_database, setting_or

    if setting_or("STRIPE_API_KEY", "invalid") or not reads_default_database(
        kwargs.get("databases")
    ):
        return []  # a key (or a bad one, E070's business), or no database to read
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
            id="llm_budgets.W070",
        )
    ]
