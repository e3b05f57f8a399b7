"""Where an optional part meets the ledger: the few points the core calls inside the ledger's
transaction, so that what a part writes there commits, or rolls back, with the ledger line it
belongs to. The Stripe outbox row of a charge, a prepaid balance's recharge and an alert's event
and delivery rows are written this way (the outbox pattern): a signal sent after the commit could
lose them, and one sent before could record a cause that rolled back.

A part subclasses :class:`LedgerHooks`, overrides the points it uses (each default does nothing)
and registers one instance, under its name, from its app's ``ready()`` (:func:`hooks_register`).
The core calls the functions below, which ask every registered part in the order they were
registered. The core imports no part: a host without a part has none of its writes.

Hooks run on the connection the core is writing through (inside ``ledger_connection()``, the
ledger's own: ``django.db.connection`` routes there), so a hook's ORM writes and the statements
it returns join the ledger's transaction (tests/test_hooks.py, tests/test_ledger_writers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_budgets.db.statements import Statement
    from llm_budgets.models import Reservation, Tenant, UsageRecord

# An event for :func:`events_record_many`: the tenant it concerns (None: the operators') and
# its body.
EventItem = tuple[int | None, dict[str, Any]]


class LedgerHooks:
    """What a part may add to the ledger's transactions. Every method is called inside the
    transaction that writes the ledger line or the cause, and must not commit."""

    def settlement_writes(
        self, reservation: Reservation, *, kind: str, customer_cost: Decimal, now: datetime
    ) -> Sequence[Statement]:
        """Statements to run with the ledger line a settlement writes for ``reservation``
        (a charge or a true-up of ``customer_cost``), in the same round trip where they can."""
        return ()

    def estimate_writes(self, source: Statement, clock: Statement) -> Sequence[Statement]:
        """Set-based statements for a sweep batch's estimate lines: one row per reservation
        ``r`` of ``source`` (a FROM clause and its parameters) charged its held customer amount
        at ``clock`` (an SQL expression and its parameters). Each must be a single INSERT that
        can also stand as a data-modifying ``WITH`` clause."""
        return ()

    def line_written(self, record: UsageRecord) -> None:
        """A ledger line written through the ORM (a void, a refund, a correction)."""

    def acts_after_charge(self, tenant_id: int) -> bool:
        """Whether :meth:`after_charge` may do anything for this tenant (cheap, cached): when
        no part does, a settlement commits in the round trip of its last writes."""
        return False

    def after_charge(self, tenant_id: int, now: datetime) -> None:
        """A charge was just written for this tenant (after its ledger line, before commit)."""

    def event_wanted(self, event_type: str, tenant_id: int | None) -> bool:
        """Whether this part may record ``event_type`` for this tenant (cheap, cached): when
        no part wants it, the core does not build its body."""
        return False

    def event_wanted_by_any(self, event_type: str) -> bool:
        """Whether this part may record ``event_type`` for some tenant or the operators."""
        return False

    def event_record(
        self,
        event_type: str,
        *,
        body: dict[str, Any],
        tenant: Tenant | int | None,
        dedupe_key: str | None,
        now: datetime | None,
        guard: str | None,
    ) -> None:
        """Record an event of the cause being written. ``guard``: the cause stands even when
        the event cannot be recorded (the part records it in a savepoint and logs a failure)."""

    def events_record_many(
        self,
        event_type: str,
        items: Sequence[EventItem],
        *,
        now: datetime | None,
        guard: str | None,
    ) -> None:
        """Record one ``event_type`` event per item (a sweep batch's), in a few statements."""


_registered: dict[str, LedgerHooks] = {}


def hooks_register(name: str, hooks: LedgerHooks) -> None:
    """Register a part's hooks under its name (its app label). Registering a name again
    replaces its hooks, so an app's ``ready()`` may run twice."""
    _registered[name] = hooks


def hooks_unregister(name: str) -> LedgerHooks | None:
    """Remove a part's hooks (tests of a host without that part); returns them."""
    return _registered.pop(name, None)


def hooks_registered() -> dict[str, LedgerHooks]:
    return dict(_registered)


def settlement_writes(
    reservation: Reservation, *, kind: str, customer_cost: Decimal, now: datetime
) -> list[Statement]:
    return [
        statement
        for hooks in _registered.values()
        for statement in hooks.settlement_writes(
            reservation, kind=kind, customer_cost=customer_cost, now=now
        )
    ]


def estimate_writes(source: Statement, clock: Statement) -> list[Statement]:
    return [s for hooks in _registered.values() for s in hooks.estimate_writes(source, clock)]


def line_written(record: UsageRecord) -> None:
    for hooks in _registered.values():
        hooks.line_written(record)


def acting_after_charge(tenant_id: int) -> list[LedgerHooks]:
    """The parts that may act after a charge for this tenant, asked once per settlement: the
    settlement commits in the round trip of its last writes when there are none, else calls each
    one's ``after_charge`` (asking again could query while the counters are locked)."""
    return [hooks for hooks in _registered.values() if hooks.acts_after_charge(tenant_id)]


def event_wanted(event_type: str, tenant_id: int | None) -> bool:
    return any(hooks.event_wanted(event_type, tenant_id) for hooks in _registered.values())


def event_wanted_by_any(event_type: str) -> bool:
    return any(hooks.event_wanted_by_any(event_type) for hooks in _registered.values())


def event_record(
    event_type: str,
    *,
    body: dict[str, Any],
    tenant: Tenant | int | None = None,
    dedupe_key: str | None = None,
    now: datetime | None = None,
    guard: str | None = None,
) -> None:
    """Record ``event_type`` for ``tenant`` (None: the operators') with every part that records
    events, in the caller's transaction."""
    for hooks in _registered.values():
        hooks.event_record(
            event_type, body=body, tenant=tenant, dedupe_key=dedupe_key, now=now, guard=guard
        )


def events_record_many(
    event_type: str,
    items: Sequence[EventItem],
    *,
    now: datetime | None = None,
    guard: str | None = None,
) -> None:
    for hooks in _registered.values():
        hooks.events_record_many(event_type, items, now=now, guard=guard)
