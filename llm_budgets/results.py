"""What the API returns, as plain data: the same classes in process and over HTTP.

No Django here: ``llm_budgets.client`` returns these very classes (it runs without Django
settings), so a caller's code sees the same types, fields and values whichever surface it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from uuid import UUID

from llm_budgets.money import ZERO


@dataclass(frozen=True)
class CommitResult:
    """What a commit charged."""

    reservation_id: UUID
    state: str
    cost: Decimal
    reserved: Decimal
    overage: Decimal  # actual cost above the hold; zero when the hold covered it
    currency: str
    customer_cost: Decimal = ZERO  # the cost at customer price (with the tenant's markup)
    pricing_basis: str = "price"  # "price", or the unknown-model policy used


@dataclass(frozen=True)
class BudgetStatus:
    """Where one budget stands now."""

    budget_id: int
    scope: str
    scope_label: str
    window: str
    limit: Decimal
    spent: Decimal
    reserved: Decimal
    remaining: Decimal
    currency: str
    period_start: datetime  # rolling: start of the oldest bucket counted
    resets_at: datetime | None  # rolling: when all spend now counted has left the window
    unit: str = "provider_cost"  # what the counter counts: provider cost or customer price
    raised: Decimal = ZERO  # included in ``limit``
    # Monthly budgets of the tenant or an end user (``reads.projections``): spent + reserved at
    # the end of the period at the recent burn rate, and when it would reach the limit before
    # the reset (None: it would not). None where there is no projection.
    projected: Decimal | None = None
    runs_out_at: datetime | None = None
