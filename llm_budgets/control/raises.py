"""Temporary raises: more room on one budget until a given time, then back by itself.

A raise is a row admission adds to the budget's limit while ``starts_at <= now < ends_at``
(see :func:`llm_budgets.engine.applicable.applicable_budgets`); nothing has to run for it to expire.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import AuditEvent, Budget, BudgetRaise


def budget_raise_grant(
    *,
    budget: Budget,
    amount: object,
    until: datetime,
    reason: str,
    actor: str = "",
    now: datetime | None = None,
) -> BudgetRaise:
    """Add ``amount`` to ``budget``'s limit from now until ``until``. Audited."""
    value = validation.money("amount", amount)
    if value <= 0:
        raise InvalidUsage("amount must be more than zero.", field="amount")
    now = now or timezone.now()
    if timezone.is_naive(until):
        raise InvalidUsage("until must be timezone-aware.", field="until")
    if until <= now:
        raise InvalidUsage("until must be in the future.", field="until")
    if not reason or not reason.strip():
        raise InvalidUsage("reason is required for a raise.", field="reason")
    with transaction.atomic():
        raise_ = BudgetRaise.objects.create(
            budget=budget,
            amount=value,
            starts_at=now,
            ends_at=until,
            reason=reason.strip(),
            granted_by=actor,
        )
        AuditEvent.objects.create(
            action="budget.raise",
            actor=actor,
            tenant=budget.tenant,
            target=f"budget {budget.pk}: {budget.scope_label} {budget.window}",
            before={"limit": str(budget.limit)},
            after={"raise": str(value), "until": until.isoformat(), "raise_id": raise_.pk},
            reason=raise_.reason,
        )
    return raise_
