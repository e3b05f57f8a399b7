"""The two staff roles of the support admin, as Django groups kept in sync after every migrate.

- **support**: view everything, trip and clear kill switches.
- **billing admin**: view everything, change limits, grant temporary raises, reset an end user's
  period spend, void ledger lines.

Add people to a group in the admin (Authentication > Groups); a person may hold both roles.
"""

from __future__ import annotations

from typing import Any

SUPPORT = "LLM budgets support"
BILLING_ADMIN = "LLM budgets billing admin"

# Model names (lower case) whose view permission both roles get.
_VIEWABLE = (
    "plan",
    "tenant",
    "enduser",
    "budget",
    "counter",
    "price",
    "modelalias",
    "reservation",
    "reservationhold",
    "usagerecord",
    "auditevent",
    "killswitch",
    "budgetraise",
    "refusal",
    "alertendpoint",
    "alertdelivery",
    "alertevent",
)

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    SUPPORT: ("add_killswitch", "change_killswitch"),
    BILLING_ADMIN: (
        "add_budget",
        "change_budget",
        "add_budgetraise",
        "reset_spend",
        "void_usagerecord",
    ),
}


def roles_sync(**kwargs: Any) -> None:
    """post_migrate receiver: create the groups and give each exactly its permissions (codenames
    of this app only). Permissions a site added to the groups by hand are kept."""
    from django.contrib.auth.models import Group, Permission

    app_permissions = Permission.objects.filter(content_type__app_label="llm_budgets")
    for name, extra in ROLE_PERMISSIONS.items():
        codenames = {f"view_{model}" for model in _VIEWABLE} | set(extra)
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*app_permissions.filter(codename__in=codenames))
