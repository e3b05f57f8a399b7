"""Reads for the admin's tenant page: where each of a tenant's budgets stands, its open holds.

Every function here runs a fixed number of queries, however many end users, budgets or holds the
tenant has: the admin page must stay fast for the biggest tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import F, Q

from llm_budgets.models import (
    LIVE_STATES,
    Budget,
    Counter,
    EndUser,
    Reservation,
    Scope,
    Tenant,
)
from llm_budgets.selectors import ApplicableBudget, BudgetStatus, budget_statuses, statuses_for
from llm_budgets.windows import ROLLING_PREFIX, tenant_period

# Rows shown per table; the page links to the full, filtered changelist beyond that.
TENANT_PAGE_ROWS = 50


@dataclass(frozen=True)
class TenantOverview:
    budgets: list[BudgetStatus]  # global, the tenant's own, and its each-end-user default
    end_user_budgets: list[BudgetStatus]  # end users' own budgets, first TENANT_PAGE_ROWS
    end_user_budget_count: int
    open_reservations: list[Reservation]  # HELD, soonest to expire first
    open_reservation_count: int
    # Issue #16: the tenant's API key, run and tag budgets; for a "*" budget, its shares (each
    # key's or run's counter) with the most used first, first TENANT_PAGE_ROWS.
    scoped_budgets: list[BudgetStatus] = field(default_factory=list)


# The scopes a call names beyond its tenant and end user, and their "*" defaults.
_NAMED_SCOPES = [Scope.API_KEY, Scope.RUN, Scope.TAG]
_SHARED_SCOPES = [Scope.API_KEY_DEFAULT, Scope.RUN_DEFAULT]


def scoped_budgets(
    tenant: Tenant, at: datetime, rows: int = TENANT_PAGE_ROWS
) -> list[BudgetStatus]:
    """The tenant's API key, run and tag budgets where they stand now, and the shares of its
    each-key and each-run budgets in their current periods, most used first. One query when the
    tenant has none, four at most."""
    budgets = list(
        Budget.objects.filter(tenant=tenant, scope__in=[*_NAMED_SCOPES, *_SHARED_SCOPES])
        .select_related("api_key", "run")
        .order_by("scope", "window")
    )
    applicable = []
    current = Q(pk__in=[])
    shared = {}
    for budget in budgets:
        budget.tenant = tenant  # labels without a query per row
        period = tenant_period(budget.window, at, tenant)
        if budget.scope in _NAMED_SCOPES:
            applicable.append(ApplicableBudget(budget, period))
        elif not budget.window.startswith(ROLLING_PREFIX):
            shared[budget.pk] = (budget, period)
            current |= Q(budget_id=budget.pk, period_start=period.start)
    applicable = applicable[:rows]
    if shared:
        shares = (
            Counter.objects.filter(current)
            .select_related("run", "api_key")
            .order_by((F("spent") + F("reserved")).desc(), "pk")[:rows]
        )
        for counter in shares:
            budget, period = shared[counter.budget_id]
            applicable.append(
                ApplicableBudget(budget, period, run=counter.run, api_key=counter.api_key)
            )
    return statuses_for(applicable) if applicable else []


def tenant_overview(tenant: Tenant, at: datetime) -> TenantOverview:
    """The tenant's budgets with the current period's numbers, and its open reservations."""
    rows = TENANT_PAGE_ROWS
    # An unsaved end user: the statuses of what applies to every end user, no one's own budget.
    shared = budget_statuses(tenant, EndUser(tenant=tenant), at)
    own_budgets = Budget.objects.filter(tenant=tenant, scope=Scope.END_USER)
    own = list(
        own_budgets.select_related("end_user").order_by("end_user__external_id", "window")[:rows]
    )
    applicable = []
    for budget in own:
        budget.tenant = tenant  # labels without a query per row
        applicable.append(ApplicableBudget(budget, tenant_period(budget.window, at, tenant)))
    # Open: still counted in reserved (held, or uncertain until usage or the reconcile job).
    held = Reservation.objects.filter(tenant=tenant, state__in=LIVE_STATES)
    open_reservations = list(held.select_related("end_user").order_by("expires_at")[:rows])
    return TenantOverview(
        budgets=shared,
        end_user_budgets=statuses_for(applicable),
        end_user_budget_count=own_budgets.count(),
        open_reservations=open_reservations,
        open_reservation_count=held.count(),
        scoped_budgets=scoped_budgets(tenant, at),
    )
