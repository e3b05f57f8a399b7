"""Setting limits: one budget per (scope, window); a change is audited."""

from __future__ import annotations

from django.db import transaction

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import AuditEvent, Budget, BudgetUnit, Scope
from llm_budgets.tenants import end_user_ensure, tenant_get
from llm_budgets.windows import window_name

ALL_END_USERS = "*"


def budget_set_limit(
    *,
    amount: object,
    window: str,
    tenant: str | None = None,
    end_user: str | None = None,
    actor: str = "",
    reason: str = "",
    unit: str | None = None,
) -> Budget:
    """Create or change the budget for a scope and window.

    No tenant: the global cap. A tenant: its cap. ``end_user="*"``: the default for each end user of
    the tenant. ``end_user="u-1"``: that end user's own budget, which replaces the default for the
    same window. ``unit``: what the budget counts, ``provider_cost`` (default) or
    ``customer_price``; fixed once the budget has counted anything. ``window`` is ``month``,
    ``day``, ``hour``, ``lifetime`` or a rolling duration such as ``rolling:1h`` / ``rolling:7d``
    (stored canonically: ``rolling:24h`` is ``rolling:1d``).
    """
    if unit is not None and unit not in BudgetUnit.values:
        raise InvalidUsage(
            f"unit must be one of {', '.join(BudgetUnit.values)}, got {unit!r}.", field="unit"
        )
    limit = validation.money("amount", amount)
    window = window_name(window)
    if end_user is not None and tenant is None:
        raise InvalidUsage(
            "end_user needs a tenant: end users belong to one tenant.", field="tenant"
        )
    with transaction.atomic():
        lookup: dict[str, object]
        if tenant is None:
            lookup = {"scope": Scope.GLOBAL}
        else:
            tenant_obj = tenant_get(tenant)
            if end_user is None:
                lookup = {"scope": Scope.TENANT, "tenant": tenant_obj}
            elif end_user == ALL_END_USERS:
                lookup = {"scope": Scope.END_USER_DEFAULT, "tenant": tenant_obj}
            else:
                user = end_user_ensure(tenant_obj, end_user)
                lookup = {"scope": Scope.END_USER, "tenant": tenant_obj, "end_user": user}
        budget = Budget.objects.select_for_update().filter(window=window, **lookup).first()
        before = None if budget is None else {"limit": str(budget.limit)}
        if budget is None:
            budget = Budget.objects.create(
                window=window,
                limit=limit,
                currency=conf.CURRENCY,
                unit=unit or BudgetUnit.PROVIDER_COST,
                **lookup,
            )
        elif unit is not None and unit != budget.unit:
            raise InvalidUsage(
                f"budget {budget.pk} counts {budget.unit}; its unit cannot change, because its "
                "counters already hold amounts in that unit. Set a budget for another window.",
                field="unit",
            )
        elif budget.limit != limit:
            budget.limit = limit
            budget.save(update_fields=["limit", "updated_at"])
        else:
            return budget
        AuditEvent.objects.create(
            action="budget.create" if before is None else "budget.change_limit",
            actor=actor,
            tenant=budget.tenant,
            target=f"budget {budget.pk}: {budget.scope_label} {window}",
            before=before,
            after={"limit": str(limit)},
            reason=reason,
        )
    return budget
