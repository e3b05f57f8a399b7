"""A guard's hold that was under the provider's bill (DESIGN.md invariant 9).

The SDK guards commit what the provider reported (``settlement.reservation_commit_provider_usage``):
that is the bill, so it is charged even where it exceeds the hold. Each such commit is made
visible three ways, so that a systematic miss (a parameter the guard under-prices, a bound too
small) is seen and fixed rather than silently absorbed: an audit row ``guard.underestimate`` in the
commit's transaction, a WARNING event of the same name after it, and the ``guard_underestimate``
metric, labelled by what went past the hold (a bounded set).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal

from llm_budgets import metrics
from llm_budgets.db import statements as sql
from llm_budgets.events import event_log
from llm_budgets.exceptions import UsageExceedsHold
from llm_budgets.models import AuditEvent, Reservation

ACTION = "guard.underestimate"
# What went past the hold, in the metric's label: the rule's field names, the tier, the cost.
REASONS = ("input_tokens", "output_tokens", "tool_calls", "service_tier", "cost")


def _reason(field: str) -> str:
    """A rule field (``tool_calls['web_search']``) as its bounded metric label."""
    return "tool_calls" if field.startswith("tool_calls") else field


@dataclass(frozen=True)
class GuardUnderestimate:
    """Provider usage beyond a guard's hold, charged as reported."""

    reservation_id: object
    tenant_id: int
    held: Decimal
    cost: Decimal
    currency: str
    reason: str
    detail: str

    @classmethod
    def of(
        cls,
        reservation: Reservation,
        beyond: UsageExceedsHold | None,
        held_tier: str,
        cost: Decimal,
    ) -> GuardUnderestimate | None:
        """The underestimate, if any: usage the hold's rule would not admit (``beyond``: more
        input than its tolerance, output above the ceiling, tool calls it did not hold), a tier
        other than the one held that costs more, or a cost above the hold. None when the hold
        covered it."""
        billed_tier = reservation.service_tier
        if beyond is None and cost <= reservation.amount:
            return None
        held = f"its hold of {reservation.amount} {reservation.currency}"
        if beyond is not None:
            reason = _reason(beyond.field or "")
            why = (
                f"{beyond.field} {beyond.reported} is more than the hold admits ({beyond.allowed})"
            )
        elif billed_tier != held_tier:
            reason = "service_tier"
            why = (
                f"it was billed at service tier {billed_tier or 'standard'!r}, held at "
                f"{held_tier or 'standard'!r}"
            )
        else:
            reason, why = "cost", "its usage costs more than the hold priced"
        detail = (
            f"The provider billed reservation {reservation.pk} {cost} {reservation.currency}, "
            f"against {held}: {why}. Charged as reported (the provider's bill); the excess is "
            "recorded as overage. Many of these mean the guard under-holds a kind of call."
        )
        return cls(
            reservation_id=reservation.pk,
            tenant_id=reservation.tenant_id,
            held=reservation.amount,
            cost=cost,
            currency=reservation.currency,
            reason=reason,
            detail=detail,
        )

    def audit_row(self) -> sql.Statement:
        """The audit row, written with the commit's ledger line."""
        event = AuditEvent(
            action=ACTION,
            actor="llm_budgets",
            tenant_id=self.tenant_id,
            target=f"reservation {self.reservation_id}",
            before={"held": str(self.held)},
            after={"cost": str(self.cost), "beyond": self.reason},
            reason=self.detail,
        )
        return sql.inserting([event])

    def announce(self) -> None:
        """After the commit: the WARNING event and the metric."""
        event_log(
            ACTION,
            level=logging.WARNING,
            reason=self.reason,
            reservation_id=self.reservation_id,
            action="commit",
            held=self.held,
            cost=self.cost,
            currency=self.currency,
            detail=self.detail,
        )
        metrics.guard_underestimate_observe(self.reason)
