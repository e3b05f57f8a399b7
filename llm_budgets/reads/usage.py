"""A tenant's usage as its pages and the REST API's ``GET tenants/<id>/usage`` both show it: its
billing months, the unit its figures count, its end users by id, and the orders of its rows. The
rows themselves are live (``reads.live``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from llm_budgets.models import Budget, BudgetUnit, EndUser, Scope, Tenant, Window
from llm_budgets.reads import live
from llm_budgets.windows import Period, tenant_period


@dataclass(frozen=True)
class Periods:
    current: Period
    previous: Period
    zone: ZoneInfo

    def days(self, period: Period) -> tuple[date, date]:
        """First and last local day of a (monthly, so bounded) period."""
        assert period.end is not None
        first = period.start.astimezone(self.zone).date()
        last = (period.end - timedelta(microseconds=1)).astimezone(self.zone).date()
        return first, last


def billing_periods(tenant: Tenant, at: datetime) -> Periods:
    """The tenant's current and previous billing month (its timezone and billing day)."""
    current = tenant_period(Window.MONTH, at, tenant)
    previous = tenant_period(Window.MONTH, current.start - timedelta(microseconds=1), tenant)
    return Periods(current, previous, ZoneInfo(tenant.timezone))


def amount_unit(tenant: Tenant) -> str:
    """What the figures count: the unit of the tenant's own budget (customer price when the host
    caps tenants at what it charges them), else provider cost."""
    unit = (
        Budget.objects.filter(tenant=tenant, scope=Scope.TENANT)
        .order_by("window")
        .values_list("unit", flat=True)
        .first()
    )
    return unit or BudgetUnit.PROVIDER_COST


def end_user_named(tenant: Tenant, external_id: str) -> EndUser:
    """The tenant's end user, or an unsaved one (no usage) if the ledger has not seen it."""
    found = tenant.end_users.filter(external_id=external_id).first()
    return found or EndUser(tenant=tenant, external_id=external_id)


# What a usage row is grouped by in the REST API's ``group_by`` and the pages' tables.
GROUPS: dict[str, tuple[str, ...]] = {k: live.GROUPS[k] for k in ("day", "model", "end_user")}

# The orders of rows grouped by end user (the pages' sort links; the API's is "amount").
END_USER_SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "amount": lambda r: (-r["total"], r["end_user__external_id"] or ""),
    "calls": lambda r: (-r["n_calls"], r["end_user__external_id"] or ""),
    "tokens": lambda r: (-r["n_output"], r["end_user__external_id"] or ""),
    "name": lambda r: r["end_user__external_id"] or "",
}
