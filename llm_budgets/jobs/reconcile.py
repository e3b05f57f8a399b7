"""Conservation check: a counter's ``spent`` is the sum of its ledger lines and its ``reserved``
the sum of its live holds; and a hot budget's stripes keep the allowance invariant
(``engine.stripes``). Reports drift; fixes nothing by itself."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Case, F, Sum, When

from llm_budgets.db.boundary import one_snapshot
from llm_budgets.engine.counters import rows_by_key
from llm_budgets.engine.stripes import allowance_excess
from llm_budgets.engine.types import CounterKey
from llm_budgets.models import LIVE_STATES, BudgetUnit, Counter, ReservationHold, UsageRecord
from llm_budgets.money import ZERO, round_charge


@dataclass(frozen=True)
class Drift:
    counter_id: int
    budget_id: int
    field: str  # "spent" or "reserved"
    stored: Decimal
    expected: Decimal

    def __str__(self) -> str:
        return (
            f"counter {self.counter_id} (budget {self.budget_id}): {self.field} is {self.stored}, "
            f"ledger says {self.expected} (drift {self.stored - self.expected})"
        )


def counters_drift() -> list[Drift]:
    """Every counter whose stored totals differ from what the ledger and live holds say.

    Each hold counts in its own unit: provider cost, or customer price. Sums are brought to the
    stored precision: SQLite adds decimals in floating point. All of it is read in one snapshot,
    so settlements committing meanwhile are not mistaken for drift."""
    with one_snapshot():
        return _drift()


def _drift() -> list[Drift]:
    customer = BudgetUnit.CUSTOMER_PRICE
    spent: dict[int, Decimal] = {}
    for row in (
        UsageRecord.objects.filter(counter__isnull=True, reservation__holds__isnull=False)
        .values("reservation__holds__counter")
        .annotate(
            total=Sum(
                Case(
                    When(reservation__holds__unit=customer, then=F("customer_cost")),
                    default=F("cost"),
                )
            )
        )
    ):
        spent[row["reservation__holds__counter"]] = round_charge(row["total"])
    # Adjustments of one counter (an end user's reset) count on that counter alone.
    for adjusted in (
        UsageRecord.objects.filter(counter__isnull=False)
        .values("counter")
        .annotate(
            total=Sum(
                Case(
                    When(counter__budget__unit=customer, then=F("customer_cost")),
                    default=F("cost"),
                )
            )
        )
    ):
        counter_id = adjusted["counter"]
        spent[counter_id] = round_charge(spent.get(counter_id, ZERO) + adjusted["total"])
    reserved: dict[int, Decimal] = {
        row["counter"]: round_charge(row["total"])
        for row in ReservationHold.objects.filter(reservation__state__in=LIVE_STATES)
        .values("counter")
        .annotate(
            total=Sum(
                Case(
                    When(unit=customer, then=F("reservation__customer_amount")),
                    default=F("reservation__amount"),
                )
            )
        )
    }
    drift = []
    for counter in Counter.objects.order_by("pk"):
        for field, expected in (
            ("spent", spent.get(counter.pk, ZERO)),
            ("reserved", reserved.get(counter.pk, ZERO)),
        ):
            stored = getattr(counter, field)
            if stored != expected:
                drift.append(Drift(counter.pk, counter.budget_id, field, stored, expected))
    return drift


@dataclass(frozen=True)
class AllowanceExcess:
    budget_id: int
    key: CounterKey
    excess: Decimal

    def __str__(self) -> str:
        return (
            f"budget {self.budget_id}, counter {tuple(self.key)}: its stripes may admit "
            f"{self.excess} more than the cap's room (allowance invariant broken)"
        )


def allowances_excess() -> list[AllowanceExcess]:
    """Every striped counter whose stripes may together admit more than their cap has left,
    net of recorded overage (:func:`llm_budgets.engine.stripes.allowance_excess`)."""
    split = (
        Counter.objects.filter(budget__counters__split_for__isnull=False).distinct().order_by("pk")
    )
    found = []
    for key, rows in rows_by_key(list(split)).items():
        excess = allowance_excess(rows)
        if excess > 0:
            found.append(AllowanceExcess(key.budget_id, key, excess))
    return found
