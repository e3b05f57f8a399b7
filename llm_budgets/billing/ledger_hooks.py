"""The Stripe part at the ledger (``llm_budgets.hooks``): the outbox row of each ledger line of a
linked tenant (``billing.outbox``) and a prepaid balance's auto-recharge (``billing.balances``),
written in the transaction of the line."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from llm_budgets.billing import balances, outbox
from llm_budgets.db.statements import Statement
from llm_budgets.hooks import LedgerHooks
from llm_budgets.models import Reservation, UsageRecord


class StripeHooks(LedgerHooks):
    def settlement_writes(
        self, reservation: Reservation, *, kind: str, customer_cost: Decimal, now: datetime
    ) -> Sequence[Statement]:
        return outbox.settlement_statements(
            reservation, kind=kind, customer_cost=customer_cost, now=now
        )

    def estimate_writes(self, source: Statement, clock: Statement) -> Sequence[Statement]:
        return [outbox.estimate_rows(source, clock)]

    def line_written(self, record: UsageRecord) -> None:
        outbox.line_add(record)

    def acts_after_charge(self, tenant_id: int) -> bool:
        return balances.tenant_may_recharge(tenant_id)

    def after_charge(self, tenant_id: int, now: datetime) -> None:
        balances.recharge_trigger(tenant_id, now)
