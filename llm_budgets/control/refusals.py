"""The compact record of refused admissions, so staff can answer "why was I blocked?".

Written after the refused transaction rolled back, in a savepoint of its own. Recording is best
effort: if it fails, the failure is logged and the refusal stands. It never becomes an admission.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime

from llm_budgets import hooks
from llm_budgets.clock import time_field
from llm_budgets.db.boundary import ledger_transaction
from llm_budgets.exceptions import BudgetExceeded, KillSwitchActive
from llm_budgets.models import Refusal, RefusalKind, Reservation
from llm_budgets.money import money, money_field
from llm_budgets.windows import rolling_window

logger = logging.getLogger("llm_budgets")


def refusal_record(
    refusal: BudgetExceeded | KillSwitchActive,
    *,
    reservation: Reservation,
    end_user: str | None = None,
    run: str | None = None,
    now: datetime,
) -> None:
    """Write one row for ``refusal``; never raises. ``end_user`` and ``run``: the ids the call
    named, kept as asked (a refused call creates neither: the row names an end user by foreign
    key only if it was seen before)."""
    try:
        row = Refusal(
            created_at=now,
            tenant_id=reservation.tenant_id,
            end_user_id=reservation.end_user_id,
            end_user_external_id=end_user or "",
            run_external_id=run or "",
            provider=reservation.provider,
            model=reservation.requested_model or reservation.model,
            requested=reservation.amount,
        )
        if isinstance(refusal, KillSwitchActive):
            row.kind = RefusalKind.KILL_SWITCH
            row.kill_switch_id = refusal.switch_id
            row.detail = f"kill switch on {refusal.scope}: {refusal.reason}"[:255]
        else:
            row.kind = RefusalKind.BUDGET
            row.budget_id = refusal.budget_id
            limit = money(refusal.limit, refusal.currency)
            row.detail = f"{refusal.scope} {refusal.window} budget, limit {limit}"[:255]
            row.remaining = refusal.remaining
            row.requested = refusal.requested
        with ledger_transaction():  # bounded: the caller may hold the budget's row
            row.save(force_insert=True)
    except Exception:
        logger.exception("llm_budgets: could not record a refusal (the refusal stands)")
    if isinstance(refusal, BudgetExceeded) and refusal.budget_id is not None:
        try:
            _exhausted(refusal, reservation, now)
        except Exception:
            logger.exception("llm_budgets: could not record a budget.exhausted alert")


def _exhausted(refusal: BudgetExceeded, reservation: Reservation, now: datetime) -> None:
    """The budget.exhausted alert: once per budget, share and period (the dedupe key), so only
    a period's first refusal writes anything; the later ones cost a set lookup (``alerts.emit``).
    A budget every tenant shares is the operators' business alone."""
    tenant_id = None if refusal.shared else reservation.tenant_id
    if not hooks.event_wanted("budget.exhausted", tenant_id):
        return
    rolling = rolling_window(refusal.window)
    # Once per span of the window's length for a rolling budget, as warnings re-arm.
    period = rolling.span_start(now) if rolling is not None else refusal.period_start or now
    share = hashlib.sha256(refusal.scope.encode()).hexdigest()[:16]
    hooks.event_record(
        "budget.exhausted",
        tenant=tenant_id,
        body={
            "budget_id": refusal.budget_id,
            "scope": refusal.scope,
            "window": refusal.window,
            "tenant": refusal.tenant,
            "end_user": refusal.end_user,
            "limit": money_field(refusal.limit),
            "currency": refusal.currency,
            "period_start": time_field(period),
            "remaining": money_field(refusal.remaining),
            "requested": money_field(refusal.requested),
            "resets_at": time_field(refusal.resets_at) if refusal.resets_at else None,
            "at": time_field(now),
        },
        dedupe_key=f"budget.exhausted:{refusal.budget_id}:{share}:{period.isoformat()}",
        now=now,
    )


def refusals_prune(*, before: datetime) -> int:
    """Delete refusal records older than ``before`` (they are diagnostics, not the ledger).
    Returns how many were deleted."""
    deleted, _ = Refusal.objects.filter(created_at__lt=before).delete()
    return deleted
