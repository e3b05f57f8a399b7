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
    """A price version as ``set_price`` added it, or as a quote used it (docs/pricing.md names
    every field); built by ``llm_budgets.pricing.prices.price_result`` only."""

    id: int
    provider: str
    model: str
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    currency: str
    effective_from: datetime
    effective_to: datetime | None
    # The fields the REST API shows of a price version beside those above.
    cached_input_per_mtok: Decimal | None  # None: cache reads at the input rate
    cache_write_per_mtok: Decimal | None  # None: cache writes at the input rate
    per_request: Decimal
    source: str  # "manual" or "imported"


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


@dataclass(frozen=True)
class ClosedRun:
    """A run as ``close_run`` left it: closed at ``closed_at`` (the first close's time if it
    was closed already). Not the error ``llm_budgets.exceptions.RunClosed``, which refuses a
    reservation naming a closed run."""

    tenant: str
    run: str
    closed_at: datetime


@dataclass(frozen=True)
class Item:
    """One line of a cost: ``quantity`` units at ``rate`` (per million tokens, or per call)."""

    dimension: str
    quantity: int
    rate: Decimal
    amount: Decimal  # unrounded


@dataclass(frozen=True)
class ModelMatch:
    """How a requested name found its price: ``model`` (of ``provider``) by ``rule``
    (``llm_budgets.pricing.model_names``)."""

    requested: str
    provider: str | None
    model: str
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        target = f"{self.provider}/{self.model}" if self.provider else self.model
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.requested} -> {target} ({self.rule}{detail})"


@dataclass(frozen=True)
class QuoteEstimate:
    """A request's estimate as a quote shows it: the fields of
    ``llm_budgets.pricing.estimates.Estimate``, the price version as a :class:`PriceResult`."""

    price: PriceResult | None  # None: the plan's fixed amount (reserve_fixed policy)
    pricing_basis: str
    input_tokens: int
    max_output_tokens: int
    items: list[Item]
    amount: Decimal  # the hold at provider cost
    markup_percent: Decimal
    customer_amount: Decimal  # the hold at customer price
    # Of amount and customer_amount, the input tolerance's part: the input a commit may report
    # beyond ``input_tokens`` (10% + 256 tokens), held so that it can never add up past a limit.
    # Its item is ``items``' ``input_tolerance``.
    input_tolerance: Decimal = Decimal(0)
    customer_input_tolerance: Decimal = Decimal(0)


@dataclass(frozen=True)
class BudgetDraw:
    """A budget the request would draw on, and whether its hold would fit now."""

    status: BudgetStatus
    unit: str
    would_hold: Decimal
    fits: bool


@dataclass(frozen=True)
class Quote:
    """What ``quote`` returns: the estimate of a request and the budgets it would draw on."""

    provider: str | None
    model: str
    estimate: QuoteEstimate
    budgets: list[BudgetDraw]
    currency: str
    # Which rule of llm_budgets.pricing.model_names found the price (None: the unknown-model
    # policy).
    model_match: ModelMatch | None = None
    # Whether each budget left out of ``budgets`` (``llm_budgets.reads.quotes.for_tenant``)
    # would fit.
    withheld_fits: tuple[bool, ...] = ()

    @property
    def admissible(self) -> bool:
        """Whether ``reserve`` would admit the request now (budgets can move meanwhile)."""
        fits = [draw.fits for draw in self.budgets] + list(self.withheld_fits)
        return bool(fits) and all(fits)


@dataclass(frozen=True)
class SwitchState:
    """An open kill switch that covers a would-be request."""

    switch_id: int
    scope: str
    reason: str
    tripped_by: str
    tripped_at: datetime
    automatic: bool
    auto_clear_at: datetime | None


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` returns: the quote, and the kill switches that would refuse it."""

    quote: Quote
    switches: list[SwitchState]

    @property
    def budgets(self) -> list[BudgetDraw]:
        """Every budget that applies: its status now, what the request would hold, ``fits``."""
        return self.quote.budgets

    @property
    def amount(self) -> Decimal:
        """The worst case admission would hold (provider cost)."""
        return self.quote.estimate.amount

    @property
    def would_admit(self) -> bool:
        """Whether admission would admit it now (without degradation)."""
        return self.quote.admissible and not self.switches
