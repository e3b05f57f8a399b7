"""The Django admin for support staff, one module per domain.

Services are the only writers of ledger state: the admin either calls them (tenants, limits,
prices) or shows the rows read-only (counters, reservations, the ledger, the audit log).
"""

from llm_budgets.admin import (
    alerts,
    api_keys,
    audit,
    billing,
    budgets,
    control,
    credits,
    jobs,
    ledger,
    memberships,
    pricing,
    tenancy,
)

__all__ = [
    "alerts",
    "api_keys",
    "audit",
    "billing",
    "budgets",
    "control",
    "credits",
    "jobs",
    "ledger",
    "memberships",
    "pricing",
    "tenancy",
]
