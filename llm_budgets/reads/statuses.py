"""Where each budget that applies stands now: spent, reserved and remaining of its current
period, read in two queries however many budgets. No writes and no locks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from llm_budgets.engine.applicable import applicable_budgets, shared_by_tenants
from llm_budgets.engine.counters import counter_totals, counters_matching, rolling_buckets
from llm_budgets.engine.types import NO_SCOPES, ApplicableBudget, CallScopes
from llm_budgets.models import Counter, EndUser, Tenant
from llm_budgets.money import ZERO
from llm_budgets.reads.projections import with_projections
from llm_budgets.results import BudgetStatus
from llm_budgets.windows import rolling_window


def tenant_visible(statuses: Sequence[BudgetStatus]) -> list[BudgetStatus]:
    """The statuses a tenant may see: every one but those of budgets all tenants share."""
    return [s for s in statuses if not shared_by_tenants(s.scope)]


def budget_statuses(
    tenant: Tenant, end_user: EndUser | None, at: datetime, scopes: CallScopes = NO_SCOPES
) -> list[BudgetStatus]:
    """Every budget that applies, with its current period's spent, reserved and remaining, and
    for the tenant's and the end user's monthly budgets the projection (``reads.projections``)."""
    statuses = statuses_for(applicable_budgets(tenant, end_user, at, scopes))
    return with_projections(statuses, tenant, end_user, at)


def statuses_for(applicable: Sequence[ApplicableBudget]) -> list[BudgetStatus]:
    """Current-period numbers for budgets whose periods are known, in two queries however many
    budgets: one for calendar counters, one for rolling windows' buckets. A period without a
    counter row yet has spent and reserved zero. A rolling budget reports its whole window:
    ``period_start`` is the oldest bucket counted, ``resets_at`` when everything now counted has
    dropped out (None if nothing is)."""
    rolling = rolling_buckets(applicable)
    calendar = [a for a in applicable if a.counter_key not in rolling]
    # A hot budget's stripes sum to its one number (engine.stripes).
    totals = counter_totals(list(Counter.objects.filter(counters_matching(calendar))))
    statuses = []
    for item in applicable:
        budget = item.budget
        period_start, resets_at = item.period.start, item.period.end
        window = rolling_window(budget.window)
        if window is not None:
            buckets = rolling[item.counter_key]
            spent = sum((b.spent for b in buckets), Decimal(0))
            reserved = sum((b.reserved for b in buckets), Decimal(0))
            period_start = window.counted_from(item.period.start)
            used = [b.start for b in buckets if b.spent or b.reserved]
            resets_at = window.leaves_at(used[-1]) if used else None
        else:
            spent, reserved = totals.get(item.counter_key, (ZERO, ZERO))
        statuses.append(
            BudgetStatus(
                budget_id=budget.pk,
                scope=budget.scope,
                scope_label=item.scope_label,
                window=budget.window,
                limit=item.limit,
                spent=spent,
                reserved=reserved,
                remaining=max(Decimal(0), item.limit - spent - reserved),
                currency=budget.currency,
                period_start=period_start,
                resets_at=resets_at,
                unit=budget.unit,
                raised=item.raised,
            )
        )
    return statuses
