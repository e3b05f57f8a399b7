"""What the API returns, as plain data: the same classes in process and over HTTP.

No Django here: ``llm_budgets.client`` returns these very classes (it runs without Django
settings), so a caller's code sees the same types, fields and values whichever surface it uses.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal
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


# What ``release`` and ``mark_uncertain`` return: the hold's state after the call.
HoldState = Literal["held", "committed", "released", "expired", "uncertain"]
HOLD_STATES: tuple[HoldState, ...] = ("held", "committed", "released", "expired", "uncertain")


def hold_state(value: object) -> HoldState:
    """``value`` as a :data:`HoldState` (a state name the app does not know is a bug: raise)."""
    for state in HOLD_STATES:
        if value == state:
            return state
    raise ValueError(f"Not a reservation state: {value!r}.")


class _Identified:
    """``pk`` as an alias of ``id`` for one release: these functions returned model instances
    before, and code that read ``.pk`` keeps working, with a ``DeprecationWarning``."""

    id: int

    @property
    def pk(self) -> int:
        warnings.warn(
            f"{type(self).__name__} is a plain result, not a model instance: read .id, not .pk "
            "(.pk goes in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.id


@dataclass(frozen=True)
class TenantResult(_Identified):
    """A tenant as ``ensure_tenant`` left it."""

    id: int
    external_id: str
    name: str
    plan: str | None  # the plan's name
    timezone: str
    billing_day: int
    billing_emails: str
    markup_percent: Decimal | None  # None: the plan's markup


@dataclass(frozen=True)
class BudgetResult(_Identified):
    """A budget as ``set_limit`` left it."""

    id: int
    scope: str
    scope_label: str  # who it limits, as a person reads it: "tenant acme", "end user u1 of acme"
    tenant: str | None  # external ids; None where the budget is not limited by it
    end_user: str | None
    window: str
    limit: Decimal
    currency: str
    unit: str  # provider_cost or customer_price
    hot: bool
    stripes: int


@dataclass(frozen=True)
class PriceResult(_Identified):
    """A price version as ``set_price`` added it (docs/pricing.md names every field)."""

    id: int
    provider: str
    model: str
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    currency: str
    effective_from: datetime
    effective_to: datetime | None


@dataclass(frozen=True)
class KillSwitchResult(_Identified):
    """A kill switch after ``trip`` or ``clear``; the same fields as the REST API's."""

    id: int
    scope: str  # "global", or e.g. "tenant acme, model m"
    tenant: str | None
    end_user: str | None
    provider: str
    model: str
    api_key: str | None  # the prefix of the key it is limited to
    run: str | None
    active: bool  # refusing admissions now
    reason: str
    tripped_by: str
    tripped_at: datetime
    automatic: bool
    detector: str
    auto_clear_at: datetime | None
    cleared_at: datetime | None
    cleared_by: str
    clear_reason: str


@dataclass(frozen=True)
class StripeLinkResult:
    """A tenant's link to a Stripe customer after ``link_stripe_customer`` or
    ``unlink_stripe_customer``."""

    tenant: str
    customer_id: str
    linked_at: datetime
    linked_by: str
    unlinked_at: datetime | None
    unlink_reason: str
