"""Temporary raises: more room on one budget until a given time, then back by itself.

A raise is a row admission adds to the budget's limit while ``starts_at <= now < ends_at``
(see :func:`llm_budgets.engine.applicable.applicable_budgets`); nothing has to run for it to expire.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.control.self_serve import (
    TenantAdmin,
    raises_active,
    self_serve_authorize,
    self_serve_limit_check,
)
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.db.ledger import configuration_written
from llm_budgets.exceptions import InvalidUsage, SelfServeDenied
from llm_budgets.models import AuditEvent, Budget, BudgetRaise, Scope


@ledger_guard("raises")
def budget_raise_grant(
    *,
    budget: Budget,
    amount: object,
    until: datetime,
    reason: str,
    actor: str = "",
    now: datetime | None = None,
    acting: TenantAdmin | None = None,
) -> BudgetRaise:
    """Add ``amount`` to ``budget``'s limit from now until ``until``. Audited.

    ``acting``: a tenant admin raising one of their own end users' budgets, so that the limit
    with every raise in force stays within the self-serve ceiling (control/self_serve.py)."""
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
    if acting is not None:
        actor = acting.actor
    with transaction.atomic():
        if acting is not None:
            self_serve_authorize(acting, action="raises", tenant=budget.tenant)
            if budget.scope != Scope.END_USER:
                # The default for each user would lift them all, not the one named.
                raise SelfServeDenied(
                    "A tenant admin raises one user's own budget only; ask support for others.",
                    action="raises",
                    field="budget",
                )
            locked = Budget.objects.select_for_update().get(pk=budget.pk)  # one raise at a time
            configuration_written(locked.tenant_id)
            self_serve_limit_check(
                budget.tenant,  # type: ignore[arg-type]
                window=locked.window,
                amount=locked.limit + raises_active(locked, now) + value,
                action="raises",
            )
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


@ledger_guard("raises")
def budget_raise_revoke(
    raise_: BudgetRaise,
    *,
    reason: str = "",
    actor: str = "",
    now: datetime | None = None,
    acting: TenantAdmin | None = None,
) -> BudgetRaise:
    """End a raise now (it stays in the history with its new end). Audited. A raise that has
    already ended is left as it is."""
    now = now or timezone.now()
    if acting is not None:
        actor = acting.actor
    with transaction.atomic():
        locked = (
            BudgetRaise.objects.select_for_update(of=("self",))
            .select_related("budget__tenant")
            .get(pk=raise_.pk)
        )
        budget = locked.budget
        if acting is not None:
            self_serve_authorize(acting, action="raises", tenant=budget.tenant)
        if locked.ends_at <= now:
            return locked
        before = {"raise": str(locked.amount), "until": locked.ends_at.isoformat()}
        # ends_at must stay after starts_at (a database constraint): a raise revoked in its
        # first instant ends one microsecond after it started.
        locked.ends_at = max(now, locked.starts_at + timedelta(microseconds=1))
        locked.save(update_fields=["ends_at"])
        AuditEvent.objects.create(
            action="budget.raise_revoke",
            actor=actor,
            tenant=budget.tenant,
            target=f"budget {budget.pk}: {budget.scope_label} {budget.window}",
            before=before,
            after={"until": locked.ends_at.isoformat(), "raise_id": locked.pk},
            reason=reason,
        )
    return locked
