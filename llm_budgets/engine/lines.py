"""Ledger lines: the one place a :class:`UsageRecord` is built, whatever writes it (commit,
expiry, uncertain settlement, a late true-up, a void, a spend reset, a floored counter).

What a line says about its call (whose it is, which model and price, its tags) is
:data:`IDENTITY`: copied from the reservation by :func:`reservation_line` (and, in SQL, by the
sweep's batch, ``settlement._estimate_lines``), and from the line it cancels by
:func:`reversal_line`, so a void's reversal carries everything its original did and every
total grouped by those fields (tags, pricing basis, model) cancels. A counter's own line (a
reset, a floor) is :func:`counter_line`; it counts on that counter alone
(``reconcile.counters_drift``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from llm_budgets.db import statements as sql
from llm_budgets.models import BudgetUnit, Counter, Reservation, UsageKind, UsageRecord
from llm_budgets.money import ZERO
from llm_budgets.usage import Usage


@dataclass(frozen=True)
class Amounts:
    """An amount at provider cost and at customer price; each counter takes its budget's unit."""

    provider: Decimal
    customer: Decimal

    def for_unit(self, unit: str) -> Decimal:
        return self.customer if unit == BudgetUnit.CUSTOMER_PRICE else self.provider

    def __neg__(self) -> Amounts:
        return Amounts(-self.provider, -self.customer)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.provider - other.provider, self.customer - other.customer)


NONE = Amounts(ZERO, ZERO)


# A line's identity fields and the reservation field each is copied from.
IDENTITY: dict[str, str] = {
    "reservation": "id",
    "tenant": "tenant",
    "end_user": "end_user",
    "run": "run",
    "provider": "provider",
    "model": "model",
    "price": "price",
    "pricing_basis": "pricing_basis",
    "currency": "currency",
    "tags": "tags",
    "service_tier": "service_tier",
    "reserved_at": "created_at",
}


@functools.cache
def _attname(model: type[Any], name: str) -> str:
    return str(model._meta.get_field(name).attname)


def reservation_line(
    reservation: Reservation,
    *,
    kind: str,
    cost: Amounts,
    estimated: bool,
    now: datetime,
    overage: Decimal = ZERO,
    usage: Usage | None = None,
    priced: tuple[int | None, str] | None = None,
) -> UsageRecord:
    """A new, unsaved line of the reservation: a charge, an estimate or a true-up. ``priced``:
    the price id and basis its cost came from, when not the reservation's (a price that
    appeared after a reserve_fixed hold)."""
    fields = {
        _attname(UsageRecord, line): getattr(reservation, _attname(Reservation, source))
        for line, source in IDENTITY.items()
    }
    if priced is not None:
        fields["price_id"], fields["pricing_basis"] = priced
    return sql.new(
        UsageRecord,
        **fields,
        kind=kind,
        cost=cost.provider,
        customer_cost=cost.customer,
        is_estimated=estimated,
        overage=overage,
        created_at=now,
        **(usage.as_fields() if usage else {}),
    )


def reversal_line(line: UsageRecord, *, now: datetime) -> UsageRecord:
    """A new, unsaved adjustment cancelling ``line`` (a void): its identity and whether it was
    estimated, the opposite cost. Token counts stay zero: a count cannot be negative, and the
    reversal cancels money, not the record that the call ran."""
    fields = {
        _attname(UsageRecord, name): getattr(line, _attname(UsageRecord, name)) for name in IDENTITY
    }
    return UsageRecord(
        **fields,
        kind=UsageKind.ADJUSTMENT,
        voids=line,
        cost=-line.cost,
        customer_cost=-line.customer_cost,
        is_estimated=line.is_estimated,
        created_at=now,
    )


def counter_line(
    counter: Counter,
    *,
    unit: str,
    amount: Decimal,
    tenant_id: int,
    end_user_id: int | None,
    currency: str,
    reserved_at: datetime,
    now: datetime,
) -> UsageRecord:
    """A new, unsaved adjustment of one counter alone (a spend reset, a floor): ``amount`` in
    the counter's ``unit`` only, zero in the other (it counts nowhere else, and neither column
    is nullable)."""
    customer = unit == BudgetUnit.CUSTOMER_PRICE
    return UsageRecord(
        kind=UsageKind.ADJUSTMENT,
        counter=counter,
        tenant_id=tenant_id,
        end_user_id=end_user_id,
        run_id=counter.run_id,
        cost=ZERO if customer else amount,
        customer_cost=amount if customer else ZERO,
        currency=currency,
        reserved_at=reserved_at,
        created_at=now,
    )


# The audit row of floor lines a settlement writes, and what it says (``settlement._move``).
FLOOR_ACTION = "settlement.floor"
FLOOR_REASON = (
    "A late settlement would have taken a counter that a correction (a spend reset or a void) "
    "had already brought lower below zero: it stopped at zero (the floor rule)."
)


def floored(floors: list[UsageRecord]) -> dict[str, str]:
    """For an audit row: each floored counter's id and the amount its floor line records."""
    return {str(f.counter_id): str(f.cost or f.customer_cost) for f in floors}


def floor_line(
    counter: Counter,
    unit: str,
    *,
    tenant_id: int,
    end_user_id: int | None,
    currency: str,
    reserved_at: datetime,
    now: datetime,
) -> UsageRecord | None:
    """The floor rule (docs/reliability.md, "Settlement after staff corrections"): a counter's
    ``spent`` never goes below zero. A refund, a downward true-up or a void that would take it
    there (a reset already gave that spend back) stops at zero, and the part not applied is
    recorded as a line of this counter alone, so the counter still equals the sum of its lines.
    Sets ``counter.spent`` and returns that line, or None when the counter stays at or above
    zero. Every other counter of the same movement takes it in full."""
    if counter.spent >= 0:
        return None
    line = counter_line(
        counter,
        unit=unit,
        amount=-counter.spent,
        tenant_id=tenant_id,
        end_user_id=end_user_id,
        currency=currency,
        reserved_at=reserved_at,
        now=now,
    )
    counter.spent = ZERO
    return line
