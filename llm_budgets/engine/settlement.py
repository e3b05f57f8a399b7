"""Settlement: commit actual usage, release an unused hold, expire overdue holds, mark a call's
outcome unknown (UNCERTAIN) and settle such holds by rule once they are old enough.

Every transition locks the reservation row first, so each reservation ends in exactly one terminal
state however many processes try. Counters are then locked in primary-key order, as in admission.
Usage is charged to the counters the hold was taken on: the period the reservation was made in.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.db import connection, transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from llm_budgets import hooks, validation
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.db import dbclock
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import (
    ledger_guard,
    ledger_transaction,
    lock_timeout_statement,
    retrying_deadlocks,
)
from llm_budgets.engine import lines
from llm_budgets.engine.lines import NONE, Amounts
from llm_budgets.engine.underestimates import GuardUnderestimate
from llm_budgets.events import (
    event_log,
    holds_expired,
    observed_expiry,
    observed_settlement,
    observed_sweep,
)
from llm_budgets.exceptions import (
    InvalidUsage,
    ReservationNotFound,
    ReservationStateError,
    UnknownPrice,
    UsageExceedsHold,
)
from llm_budgets.models import (
    LIVE_STATES,
    AuditEvent,
    BudgetUnit,
    Counter,
    Price,
    PricingBasis,
    Reservation,
    ReservationHold,
    ReservationState,
    UsageKind,
    UsageRecord,
)
from llm_budgets.money import ZERO, money_field, round_charge
from llm_budgets.pricing.costs import actual_cost, customer_charge, worst_case
from llm_budgets.pricing.prices import price_in_effect
from llm_budgets.request import service_tier_validate
from llm_budgets.results import CommitResult as CommitResult  # its home until issue #10
from llm_budgets.signals import reservation_settled
from llm_budgets.usage import Usage, usage_keywords, usage_validate, usage_within_hold


def _held(reservation: Reservation) -> Amounts:
    return Amounts(reservation.amount, reservation.customer_amount)


def _charged(record: UsageRecord) -> Amounts:
    return Amounts(record.cost, record.customer_cost)


def _reservation_id(value: object) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise InvalidUsage(
            f"reservation id must be a UUID, got {value!r}.", field="reservation_id"
        ) from None


def reservation_get(reservation_id: object) -> Reservation:
    """The reservation with this id (a read: nothing is locked); ``ReservationNotFound``."""
    rid = _reservation_id(reservation_id)
    with ledger_guard("read"):
        reservation = Reservation.objects.select_related("tenant", "end_user").filter(pk=rid)
        found = reservation.first()
    if found is None:
        raise ReservationNotFound(rid)
    return found


@contextmanager
def _locked(reservation_id: UUID, action: str) -> Iterator[Reservation]:
    """One settlement transition: a bounded lock wait, one transaction, and the reservation row
    locked before anything else, so each reservation ends in exactly one terminal state however
    many processes try. A database failure becomes ``LedgerUnavailable`` (fail closed)."""
    with ledger_guard(action), ledger_transaction(bounded=False):
        yield _lock_reservation(reservation_id)


def _lock_reservation(reservation_id: UUID) -> Reservation:
    """The transaction's first statement, sent with the bound on its lock waits."""
    rows = sql.fetch(_lock_reservation_sql(), [_pk(reservation_id)], first=lock_timeout_statement())
    row = next(iter(rows), None)
    if row is None:
        raise ReservationNotFound(reservation_id)
    reservation = sql.row_to(Reservation, row)
    offset = sql.width(Reservation)
    reservation.price = None if row[offset] is None else sql.row_to(Price, row, offset)
    return reservation


@functools.cache
def _lock_reservation_sql() -> str:
    """The reservation with its price version, locking only the reservation: a plain FOR UPDATE
    would also lock the joined price row, which every admission key-share locks for its foreign
    key (a deadlock). One statement without the ORM's compilation (``db.statements``)."""
    return (
        f"SELECT {sql.columns(Reservation, 'r')}, {sql.columns(Price, 'p')}"  # noqa: S608
        f" FROM {sql.table(Reservation)} r"
        f" LEFT JOIN {sql.table(Price)} p ON p.id = r.{sql.column(Reservation, 'price')}"
        f" WHERE r.id = %s{sql.lock_clause(of=('r',))}"
    )


def _pk(reservation_id: UUID) -> object:
    return sql.param(Reservation, "id", reservation_id)


def _move(
    reservation: Reservation,
    *,
    reserved: Amounts,
    spent: Amounts,
    transition_writes: Sequence[sql.Statement] = (),
    last: bool = False,
    now: datetime | None = None,
) -> None:
    """Add ``reserved`` and ``spent`` (either may be negative) to every counter of the hold, each
    in the unit its hold was taken in (provider cost or customer price), together with the
    transition's own writes (``transition_writes``: its ledger line, its state), which run first.

    The counters are locked last, in pk order as admission locks them, and only for this write
    and the commit: everything else is computed before. On PostgreSQL the writes, the locks and
    the additions are one statement (numeric arithmetic is exact there). Elsewhere, and for a
    movement that lowers ``spent`` (a late refund or true-up down, booked at ``now``), the sums
    are Decimal arithmetic here on the locked rows (SQLite's is floating point), so the floor
    rule can see each counter: none goes below zero (``lines.floor_line``). ``last``: the
    transaction's last writes, committed in the same round trip where they can be
    (``statements.run_committing``).
    """
    lowers = spent.provider < 0 or spent.customer < 0
    if connection.vendor == "postgresql" and not lowers:
        params = [
            reserved.customer,
            reserved.provider,
            spent.customer,
            spent.provider,
            _pk(reservation.pk),
        ]
        writes = [*transition_writes, (_add_to_held_counters_sql(), params)]
        (sql.run_committing if last else sql.run)(writes)
        return
    counters, floors = [], []
    for row in sql.fetch(_held_counters_sql(), [_pk(reservation.pk)]):
        counter, unit = sql.row_to(Counter, row), row[-1]
        counter.reserved += reserved.for_unit(unit)
        counter.spent += spent.for_unit(unit)
        floor = lines.floor_line(
            counter,
            unit,
            tenant_id=reservation.tenant_id,
            end_user_id=reservation.end_user_id,
            currency=reservation.currency,
            reserved_at=reservation.created_at,
            now=now or timezone.now(),
        )
        if floor is not None:
            floors.append(floor)
        counters.append(counter)
    if not floors:
        Counter.objects.write(
            counters, ["reserved", "spent"], transition_writes=transition_writes, commit=last
        )
        return
    # Rare: the floor lines and their audit row (which names them, for the support pages) are
    # written after, in the same transaction, which the block's exit commits.
    Counter.objects.write(counters, ["reserved", "spent"], transition_writes=transition_writes)
    for floor in floors:
        floor.save()
    AuditEvent.objects.create(
        action=lines.FLOOR_ACTION,
        actor="llm_budgets",
        tenant_id=reservation.tenant_id,
        target=f"reservation {reservation.pk}",
        after={
            "lines": [floor.pk for floor in floors],
            "floored": lines.floored(floors),
        },
        reason=lines.FLOOR_REASON,
    )


def _held_from() -> str:
    """The counters of a reservation's hold (``c``) with their hold (``h``); one parameter."""
    return (
        f"{sql.table(Counter)} c JOIN {sql.table(ReservationHold)} h"
        f" ON h.{sql.column(ReservationHold, 'counter')} = c.id"
        f" WHERE h.{sql.column(ReservationHold, 'reservation')} = %s"
    )


@functools.cache
def _held_counters_sql() -> str:
    """The counters a reservation holds on, each with its hold's unit, locked in pk order."""
    return (
        f"SELECT {sql.columns(Counter, 'c')}, h.{sql.column(ReservationHold, 'unit')}"  # noqa: S608
        f" FROM {_held_from()} ORDER BY c.id{sql.lock_clause(of=('c',))}"
    )


@functools.cache
def _add_to_held_counters_sql() -> str:
    """PostgreSQL: lock the hold's counters in pk order (the sub-select's ``FOR UPDATE`` takes
    them in the order it returns them), then add to each in its hold's unit. Parameters: the
    reserved change at customer price and at provider cost, the same for spent, the
    reservation id."""
    reserved, spent = sql.column(Counter, "reserved"), sql.column(Counter, "spent")
    unit = sql.column(ReservationHold, "unit")
    customer = BudgetUnit.CUSTOMER_PRICE.value
    by_unit = f"CASE WHEN l.{unit} = '{customer}' THEN %s::numeric ELSE %s::numeric END"
    return (
        f"UPDATE {sql.table(Counter)} AS t"  # noqa: S608
        f" SET {reserved} = t.{reserved} + {by_unit}, {spent} = t.{spent} + {by_unit}"
        f" FROM (SELECT c.id, h.{unit} FROM {_held_from()} ORDER BY c.id FOR UPDATE OF c) l"
        f" WHERE t.id = l.id"
    )


def _result(reservation: Reservation) -> CommitResult:
    """What the settlement charged: its charge and true-up lines. A staff correction since (a
    void) is not part of it, so settling again still returns the first result."""
    settled = reservation.usage_records.exclude(kind=UsageKind.ADJUSTMENT)
    totals = settled.aggregate(
        cost=Sum("cost"), overage=Sum("overage"), customer_cost=Sum("customer_cost")
    )
    last = settled.order_by("-created_at", "-pk").first()
    return CommitResult(
        reservation_id=reservation.pk,
        state=str(reservation.state),
        # SQLite sums decimals with float-like scale: bring totals back to the stored precision.
        cost=round_charge(totals["cost"] or ZERO),
        reserved=reservation.amount,
        overage=round_charge(totals["overage"] or ZERO),
        currency=reservation.currency,
        customer_cost=round_charge(totals["customer_cost"] or ZERO),
        pricing_basis=last.pricing_basis if last else reservation.pricing_basis,
    )


def _settled(reservation: Reservation, state: str, now: datetime) -> sql.Statement:
    """Move the reservation to a terminal ``state``: the statement (the caller runs it)."""
    reservation.state = state
    reservation.settled_at = now
    return sql.updating(reservation, ["state", "settled_at"])


def _actual(
    reservation: Reservation, usage: Usage, now: datetime
) -> tuple[Decimal, int | None, str]:
    """Cost of ``usage`` for the reservation, with the price id and basis it came from.

    The reservation's price version prices it (time-of-day rates at the settle time, clamped to
    the reservation's lifetime). Under the reserve_fixed policy it costs the fixed amount, unless
    a price for the model has appeared meanwhile."""
    price = reservation.price
    basis = str(reservation.pricing_basis)
    if price is None:
        try:
            price = price_in_effect(provider=reservation.provider, model=reservation.model, at=now)
            basis = PricingBasis.PRICE
        except UnknownPrice:
            return reservation.amount, None, basis
    at = min(max(now, reservation.created_at), reservation.expires_at)
    try:
        cost = actual_cost(price, usage, at=at, service_tier=reservation.service_tier)
    except UnknownPrice:
        if reservation.price is not None:
            raise
        # A fixed hold at a tier the price that appeared since does not list: the fixed amount,
        # as when no price appeared (a commit that could never succeed would leave it to expire).
        return reservation.amount, None, str(reservation.pricing_basis)
    return cost, price.pk, basis


def _announce_settled(reservation: Reservation, state: str, cost: Decimal) -> None:
    """``reservation_settled``, sent once the ledger's transaction commits."""
    transaction.on_commit(
        functools.partial(
            reservation_settled.send,
            sender=Reservation,
            reservation_id=reservation.pk,
            tenant_id=reservation.tenant_id,
            state=str(state),
            cost=cost,
            currency=reservation.currency,
        )
    )


@observed_settlement("commit")
@retrying_deadlocks
def reservation_commit(
    reservation_id: object,
    *,
    input_tokens: object = None,
    output_tokens: object = None,
    cached_input_tokens: object = 0,
    cache_write_tokens: object = 0,
    cache_write_1h_tokens: object = 0,
    reasoning_tokens: object = 0,
    tool_calls: object = None,
    usage: Usage | None = None,
    now: datetime | None = None,
) -> CommitResult:
    """Charge actual usage at the reservation's price version. Give the counts (the public
    convention, see ``llm_budgets.usage``) or a translated ``usage``.

    Settling twice returns the first result; a late commit after expiry trues the estimated
    charge up (or down) to the actual cost. Usage the hold could not have produced is refused
    (``usage.usage_within_hold``) unless the host records it (``USAGE_BEYOND_HOLD``)."""
    if usage is None:
        usage = usage_validate(**usage_keywords(locals()))
    return _commit(_reservation_id(reservation_id), usage, now or timezone.now())


@observed_settlement("commit")
@retrying_deadlocks
def reservation_commit_provider_usage(
    reservation_id: object,
    *,
    usage: Usage,
    service_tier: str | None = None,
    now: datetime | None = None,
) -> CommitResult:
    """The SDK guards' commit: ``usage`` is what the provider reported for the call (or the
    guard's worst case of what it billed), so it is the bill and is charged as it is, even
    beyond the hold (DESIGN.md invariant 9). The excess is overage on the line, an audit row
    (``guard.underestimate``), a WARNING event and the ``guard_underestimate`` metric, so a
    systematic miss is seen. ``service_tier``: the billing modifiers the answer says it was
    billed at, when not the ones held (a project whose default tier is priority).

    Internal to the guards: the plausibility rule exists for usage a caller reports itself,
    which this path would skip, so neither ``budgets`` nor the REST API reach it."""
    tier = service_tier_validate(service_tier) if service_tier else service_tier
    return _commit(
        _reservation_id(reservation_id),
        usage,
        now or timezone.now(),
        provider_reported=True,
        billed_tier=tier,
    )


def _commit(
    rid: UUID,
    usage: Usage,
    now: datetime,
    *,
    provider_reported: bool = False,
    billed_tier: str | None = None,
) -> CommitResult:
    """One commit of usage a caller reports (the plausibility rule applies) or, with
    ``provider_reported``, of usage the provider reported (recorded as it is) at the tier it
    says it billed at (``billed_tier``; None: the one held)."""
    beyond: UsageExceedsHold | None = None
    under: GuardUnderestimate | None = None
    with _locked(rid, "commit") as reservation:
        if reservation.state == ReservationState.COMMITTED:
            return _result(reservation)
        if reservation.state == ReservationState.RELEASED:
            raise ReservationStateError(
                f"Reservation {rid} was released, so it cannot be committed: a release "
                "says the call produced nothing. Reserve again for a new call.",
                state=reservation.state,
            )
        if not provider_reported:
            beyond = _beyond_hold(reservation, usage)
            provider_cost, price_id, basis = _actual(reservation, usage, now)
            audit = [] if beyond is None else [_recorded_beyond(reservation, beyond, provider_cost)]
        else:
            held_tier = reservation.service_tier
            if billed_tier is not None:
                reservation.service_tier = billed_tier  # the line records the tier it charged
            provider_cost, price_id, basis = _actual(reservation, usage, now)
            beyond_rule = _outside_rule(reservation, usage)
            under = GuardUnderestimate.of(reservation, beyond_rule, held_tier, provider_cost)
            audit = [] if under is None else [under.audit_row()]
        cost = Amounts(provider_cost, customer_charge(provider_cost, reservation.markup_percent))
        overage = max(ZERO, provider_cost - reservation.amount)
        kind, charge, unhold = UsageKind.CHARGE, cost, _held(reservation)
        if reservation.state not in LIVE_STATES:
            # EXPIRED: the sweep already dropped the hold and may have charged an estimate.
            unhold = NONE
            estimate = reservation.usage_records.filter(kind=UsageKind.CHARGE).first()
            if estimate is not None:
                kind, charge = UsageKind.TRUE_UP, cost - _charged(estimate)
            else:
                # Dropped at expiry (policy "release"): nothing is held or charged for this
                # call any more, so all of its cost lands beyond what admission checked, and
                # all of it is recorded as overage (invariant 1: the only excess allowed).
                overage = provider_cost
        line = lines.reservation_line(
            reservation,
            kind=kind,
            cost=charge,
            estimated=False,
            now=now,
            overage=overage,
            usage=usage,
            priced=(price_id, basis),
        )
        committed = _settled(reservation, ReservationState.COMMITTED, now)
        billed = hooks.settlement_writes(
            reservation, kind=kind, customer_cost=charge.customer, now=now
        )
        after = hooks.acting_after_charge(reservation.tenant_id)
        _move(
            reservation,
            reserved=-unhold,
            spent=charge,
            transition_writes=[sql.inserting([line]), *billed, *audit, committed],
            last=not after,
            now=now,
        )
        for part in after:  # e.g. a prepaid balance with auto-recharge: this commit may cross it
            part.after_charge(reservation.tenant_id, now)
        _announce_settled(reservation, ReservationState.COMMITTED, provider_cost)
    if beyond is not None:  # after the commit: the ledger has it
        event_log(
            "settlement.beyond_hold",
            level=logging.WARNING,
            reason=beyond.code,
            reservation_id=rid,
            action="commit",
            detail=beyond.message,
        )
    if under is not None:
        under.announce()
    # The charge (and any true-up) lines sum to ``cost``: no need to read them back.
    return CommitResult(
        reservation_id=reservation.pk,
        state=str(reservation.state),
        cost=provider_cost,
        reserved=reservation.amount,
        overage=overage,
        currency=reservation.currency,
        customer_cost=cost.customer,
        pricing_basis=basis,
    )


def _outside_rule(reservation: Reservation, usage: Usage) -> UsageExceedsHold | None:
    """Why ``usage`` is more than the hold admits (``usage.usage_within_hold``), or None."""
    try:
        usage_within_hold(
            usage,
            reservation_id=reservation.pk,
            input_tokens=reservation.input_tokens,
            max_output_tokens=reservation.max_output_tokens,
            max_tool_calls=reservation.max_tool_calls,
        )
    except UsageExceedsHold as beyond:
        return beyond
    return None


def _beyond_hold(reservation: Reservation, usage: Usage) -> UsageExceedsHold | None:
    """Refuse usage the hold could not have produced, unless the host records it
    (``USAGE_BEYOND_HOLD="record"``): then the error, to record with the line."""
    beyond = _outside_rule(reservation, usage)
    # Cache counts beyond the input are malformed, not merely large: never recorded.
    if beyond is not None and (
        conf.USAGE_BEYOND_HOLD != "record" or beyond.field == "cached_input_tokens"
    ):
        raise beyond
    return beyond


def _recorded_beyond(
    reservation: Reservation, beyond: UsageExceedsHold, provider_cost: Decimal
) -> sql.Statement:
    """Usage beyond the hold, recorded by the host's choice: bounded (at most
    ``USAGE_BEYOND_HOLD_MAX_PERCENT`` above the hold, else refused as it would be by default),
    charged as overage (the line's), and an audit row staff see beside the log event."""
    percent = conf.USAGE_BEYOND_HOLD_MAX_PERCENT
    bound = round_charge(reservation.amount * (100 + percent) / 100)
    if provider_cost > bound:
        raise UsageExceedsHold(
            f"{beyond.message} Recording usage beyond a hold is allowed up to "
            f"USAGE_BEYOND_HOLD_MAX_PERCENT ({percent}%) above it ({bound} "
            f"{reservation.currency}); this usage costs {provider_cost}.",
            field=beyond.field or "",
            reservation_id=beyond.reservation_id,
            reported=beyond.reported,
            allowed=beyond.allowed,
        )
    event = AuditEvent(
        action="usage.beyond_hold",
        actor="llm_budgets",
        tenant_id=reservation.tenant_id,
        target=f"reservation {reservation.pk}",
        before={"held": str(reservation.amount), "allowed": beyond.allowed},
        after={"cost": str(provider_cost), beyond.field or "": beyond.reported},
        reason=beyond.message,
    )
    return sql.inserting([event])


@observed_settlement("release")
@retrying_deadlocks
def reservation_release(reservation_id: object, *, now: datetime | None = None) -> str:
    """Drop the hold: the call provably produced nothing. Returns the reservation's final state.

    Releasing a committed reservation changes nothing and returns ``committed``; releasing twice
    is a no-op. Releasing an expired hold that was charged as an estimate refunds the estimate.
    """
    rid = _reservation_id(reservation_id)
    now = now or timezone.now()
    with _locked(rid, "release") as reservation:
        if reservation.state in (ReservationState.COMMITTED, ReservationState.RELEASED):
            return str(reservation.state)
        _announce_settled(reservation, ReservationState.RELEASED, ZERO)
        was_live = reservation.state in LIVE_STATES
        estimate = (
            None if was_live else reservation.usage_records.filter(kind=UsageKind.CHARGE).first()
        )
        released = _settled(reservation, ReservationState.RELEASED, now)
        if was_live:
            _move(
                reservation,
                reserved=-_held(reservation),
                spent=NONE,
                transition_writes=[released],
                last=True,
            )
        elif estimate is not None:
            refund = lines.reservation_line(
                reservation,
                kind=UsageKind.TRUE_UP,
                cost=-_charged(estimate),
                estimated=False,
                now=now,
            )
            billed = hooks.settlement_writes(
                reservation,
                kind=UsageKind.TRUE_UP,
                customer_cost=-estimate.customer_cost,
                now=now,
            )
            _move(
                reservation,
                reserved=NONE,
                spent=-_charged(estimate),
                transition_writes=[sql.inserting([refund]), *billed, released],
                now=now,
            )
        else:
            sql.run([released])
        return str(reservation.state)


@observed_settlement("extend")
@retrying_deadlocks
def reservation_extend(
    reservation_id: object, *, ttl: object, now: datetime | None = None
) -> Reservation:
    """Push a held reservation's ``expires_at`` to ``now + ttl`` seconds (never earlier than it
    already is), for a call that runs longer than planned. Only a HELD reservation can be
    extended, including one past its expiry that the sweep has not reached yet. ``now``
    defaults to the database's clock, as admission's does (``db.dbclock``): a process whose
    clock is off cannot push a hold's expiry off by its skew."""
    rid = _reservation_id(reservation_id)
    seconds = validation.ttl_seconds("ttl", ttl)
    with _locked(rid, "extend") as reservation:
        now = dbclock.now_for(now)
        if reservation.state != ReservationState.HELD:
            raise ReservationStateError(
                f"Reservation {rid} is {reservation.state}, so it cannot be extended: only a "
                "held reservation has an expiry to push back.",
                state=reservation.state,
            )
        expires_at = now + timedelta(seconds=seconds)
        if expires_at > reservation.expires_at:
            _refuse_a_dearer_span(reservation, expires_at)
            reservation.expires_at = expires_at
            reservation.save(update_fields=["expires_at"])
        return reservation


def _refuse_a_dearer_span(reservation: Reservation, expires_at: datetime) -> None:
    """A hold prices the dearest time-of-day rates of its lifetime, and a charge uses the rates
    at settlement clamped to that lifetime: an extension that reaches dearer rates would let a
    commit within the rule cost more than its hold, an allowance that adds up call after call
    (issue #38). Refused, nothing changed; a price without daily spans never refuses."""
    price = reservation.price
    if price is None or not price.daily_spans:
        return

    def held_for(end: datetime) -> Decimal:
        return worst_case(
            price,
            input_tokens=reservation.input_tokens,
            max_output_tokens=reservation.max_output_tokens,
            start=reservation.created_at,
            end=end,
            tool_calls=reservation.max_tool_calls or {},
            service_tier=reservation.service_tier,
        )

    held, needed = held_for(reservation.expires_at), held_for(expires_at)
    if needed > held:
        raise InvalidUsage(
            f"Extending reservation {reservation.pk} to {expires_at.isoformat()} would take it "
            f"into a time-of-day price its hold does not cover (it may then cost up to {needed} "
            f"{reservation.currency}, its hold priced {held}). Nothing was changed: settle the "
            f"call by {reservation.expires_at.isoformat()}, or release it and reserve again for "
            "the longer call.",
            field="ttl",
        )


def _charge_held_as_estimated(
    reservation: Reservation, *, state_write: sql.Statement, now: datetime
) -> None:
    """Move the whole hold to spent as an *estimated* charge (expiry, uncertain reconcile): its
    ledger line, the line's outbox row and ``state_write`` go with the counter update."""
    estimate = lines.reservation_line(
        reservation, kind=UsageKind.CHARGE, cost=_held(reservation), estimated=True, now=now
    )
    billed = hooks.settlement_writes(
        reservation, kind=UsageKind.CHARGE, customer_cost=reservation.customer_amount, now=now
    )
    _move(
        reservation,
        reserved=-_held(reservation),
        spent=_held(reservation),
        transition_writes=[sql.inserting([estimate]), *billed, state_write],
    )


@observed_expiry
@retrying_deadlocks
def reservation_expire(reservation_id: object, *, now: datetime | None = None) -> bool:
    """Expire one overdue hold. By default its amount is charged as *estimated* spend (a timeout is
    no proof the provider stopped); with ``EXPIRED_HOLD_POLICY="release"`` it is dropped. Returns
    whether this call expired it (False if it was settled meanwhile or is not yet due)."""
    rid = _reservation_id(reservation_id)
    now = now or timezone.now()
    with _locked(rid, "expiry") as reservation:
        if reservation.state != ReservationState.HELD or reservation.expires_at > now:
            return False
        expired = _settled(reservation, ReservationState.EXPIRED, now)
        if conf.EXPIRED_HOLD_POLICY == "charge":
            _charge_held_as_estimated(reservation, state_write=expired, now=now)
        else:
            _move(
                reservation, reserved=-_held(reservation), spent=NONE, transition_writes=[expired]
            )
        _expired_alerts([reservation.pk], now)
        return True


def _expired_alerts(ids: Sequence[object], now: datetime | None) -> None:
    """The hold.expired alerts of holds just expired, in the transaction that expired them: one
    read of the batch and a few inserts, and nothing at all (a set lookup) when nobody
    subscribes."""
    if not ids or not hooks.event_wanted_by_any("hold.expired"):
        return
    policy = conf.EXPIRED_HOLD_POLICY
    rows = Reservation.objects.filter(pk__in=list(ids)).select_related("tenant", "end_user")
    items = [
        (
            r.tenant_id,
            {
                "reservation_id": str(r.pk),
                "tenant": r.tenant.external_id,
                "end_user": r.end_user.external_id if r.end_user else None,
                "model": r.model,
                "amount": money_field(r.amount),
                "currency": r.currency,
                "policy": policy,
                "reserved_at": time_field(r.created_at),
                "expired_at": time_field(r.settled_at or now or timezone.now()),
            },
        )
        for r in rows.order_by("expires_at", "pk")
    ]
    hooks.events_record_many("hold.expired", items, now=now, guard="expired holds")


# The most holds one sweep transaction expires (its counters wait for it at most that long).
SWEEP_BATCH_MAX = 5000


# Holds per sweep transaction by default: 10^5 overdue holds took 37 s in batches of 500 and
# 21 s in batches of 2,000 on a loaded 2-core machine (docs/performance.md), mostly commits; an
# admission under the same budgets waits for one batch at most (a few hundred ms there).
SWEEP_BATCH = 2000


@observed_sweep
def reservations_sweep(*, now: datetime | None = None, batch_size: int = SWEEP_BATCH) -> int:
    """Expire every overdue hold, a batch at a time, one short transaction per batch
    (:func:`_expire_batch`). Returns how many expired.

    "Overdue" is read on the database's clock, never this process's: a sweeper whose clock runs
    ahead cannot expire someone else's hold early (docs/control.md). ``now`` names the instant
    instead (tests, replaying a sweep); the jobs and the command never pass it."""
    size = max(1, min(int(batch_size), SWEEP_BATCH_MAX))
    if connection.features.max_query_params:  # SQLite: a batch's ids are parameters
        size = min(size, connection.features.max_query_params - 2)
    expired = 0
    while True:
        with ledger_guard("sweep"), ledger_transaction():
            batch = _expire_batch(now, size)
            _expired_alerts(batch, now)
        holds_expired(batch)  # after the commit: the log lines and the metric
        expired += len(batch)
        if len(batch) < size:
            return expired


def _expire_batch(now: datetime | None, size: int) -> list[object]:
    """Expire up to ``size`` overdue holds in the caller's transaction; returns their ids.

    The holds are locked first, oldest due first, skipping any that a commit, release or another
    sweeper holds (``SKIP LOCKED``: that transition wins, and a later batch or sweep sees its
    result). Then, each as one set-based write for the whole batch: the reservations' state, the
    estimate lines (``EXPIRED_HOLD_POLICY="charge"``) with their outbox rows, and last the
    counters, each once with the batch's total for it, locked in pk order as admission locks
    them. On PostgreSQL all of it is one statement built from the locked rows (exact numeric
    arithmetic, one round trip): an admission under the same budgets waits one batch at most."""
    charge = conf.EXPIRED_HOLD_POLICY == "charge"
    clock = (dbclock.now_sql(), []) if now is None else ("%s", _at(now))
    if connection.vendor == "postgresql":
        text, params = _batch_statement(clock, size, charge=charge)
        return [row[0] for row in sql.fetch(text, params, first=lock_timeout_statement())]
    rows = sql.fetch(_due_sql(db_clock=now is None), [ReservationState.HELD.value, *clock[1], size])
    if not rows:
        return []
    clock = ("%s", _at(now or dbclock.from_value(rows[0][0])))
    reservations = [sql.row_to(Reservation, row, 1) for row in rows]
    ids = [_pk(r.pk) for r in reservations]
    picked = f"SELECT * FROM {sql.table(Reservation)} WHERE id IN {_in_list(len(ids))}"  # noqa: S608
    these = (f"({picked}) r", ids)
    writes = [
        (
            f"UPDATE {sql.table(Reservation)} SET {sql.column(Reservation, 'state')} = %s,"  # noqa: S608
            f" {sql.column(Reservation, 'settled_at')} = %s WHERE id IN {_in_list(len(ids))}",
            [ReservationState.EXPIRED.value, *clock[1], *ids],
        )
    ]
    if charge:
        writes += [_estimate_lines(these, clock), *hooks.estimate_writes(these, clock)]
    held = {r.pk: _held(r) for r in reservations}
    released: dict[int, Decimal] = {}  # per counter, what the batch held on it, in its unit
    for rid, counter_id, unit in sql.fetch(_batch_holds_sql(len(ids)), ids):
        amount = held[_reservation_id(rid)].for_unit(unit)
        released[counter_id] = released.get(counter_id, ZERO) + amount
    counters = [
        sql.row_to(Counter, row)
        for row in sql.fetch(_counters_by_pk_sql(len(released)), sorted(released))
    ]
    for counter in counters:
        counter.reserved -= released[counter.pk]
        counter.spent += released[counter.pk] if charge else ZERO
    Counter.objects.write(counters, ["reserved", "spent"], transition_writes=writes)
    return [r.pk for r in reservations]


def _at(now: datetime) -> list[object]:
    return [sql.param(Reservation, "expires_at", now)]


def _in_list(count: int) -> str:
    return "(" + ", ".join(["%s"] * count) + ")"


# How an estimate line's columns come from its reservation ``r`` (the rest take their default):
# the SQL form of ``lines.reservation_line(r, kind=CHARGE, cost=_held(r), estimated=True,
# now=...)``, for a whole batch at once. ``tests/test_sweep.py`` checks that both write the same
# line.
_ESTIMATE_FROM_RESERVATION = {
    **lines.IDENTITY,
    "cost": "amount",
    "customer_cost": "customer_amount",
}
# Line fields with a value of their own; every other field takes its default.
_ESTIMATE_CONSTANTS = {"kind": UsageKind.CHARGE.value, "is_estimated": True}


def _estimate_lines(source: sql.Statement, clock: sql.Statement) -> sql.Statement:
    """Insert the estimate line of every reservation ``r`` of ``source`` (a FROM clause and its
    parameters), booked at ``clock`` (an SQL expression and its parameters)."""
    names, values, params = [], [], []
    for field in sql.insert_fields(UsageRecord):
        names.append(sql.quote(field.column))
        if field.name in _ESTIMATE_FROM_RESERVATION:
            values.append(f"r.{sql.column(Reservation, _ESTIMATE_FROM_RESERVATION[field.name])}")
        elif field.name == "created_at":
            values.append(clock[0])
            params.extend(clock[1])
        else:
            value = _ESTIMATE_CONSTANTS.get(field.name, field.get_default())
            values.append("%s")
            params.append(field.get_db_prep_save(value, connection))
    text = (
        f"INSERT INTO {sql.table(UsageRecord)} ({', '.join(names)})"  # noqa: S608
        f" SELECT {', '.join(values)} FROM {source[0]}"
    )
    return text, [*params, *source[1]]


def _batch_statement(clock: sql.Statement, size: int, *, charge: bool) -> sql.Statement:
    """PostgreSQL: one sweep batch as one statement, returning the ids it expired. ``due`` locks
    the overdue holds; the other clauses write from those locked rows (one snapshot: each writes
    rows no other clause touches); ``locked`` takes the counters in pk order last."""
    res, hold, counter = Reservation, ReservationHold, Counter
    expires = sql.column(res, "expires_at")
    unit = sql.column(hold, "unit")
    customer = BudgetUnit.CUSTOMER_PRICE.value
    reserved, spent = sql.column(counter, "reserved"), sql.column(counter, "spent")
    clauses: list[sql.Statement] = [
        (
            f"due AS (SELECT r.* FROM {sql.table(res)} r"  # noqa: S608
            f" WHERE r.{sql.column(res, 'state')} = %s AND r.{expires} <= {clock[0]}"
            f" ORDER BY r.{expires} LIMIT %s FOR UPDATE OF r SKIP LOCKED)",
            [ReservationState.HELD.value, *clock[1], size],
        ),
        (
            f"expired AS (UPDATE {sql.table(res)} t SET {sql.column(res, 'state')} = %s,"  # noqa: S608
            f" {sql.column(res, 'settled_at')} = {clock[0]} FROM due WHERE t.id = due.id"
            f" RETURNING t.id)",
            [ReservationState.EXPIRED.value, *clock[1]],
        ),
    ]
    if charge:
        estimates, estimates_params = _estimate_lines(("due r", []), clock)
        clauses.append((f"lines AS ({estimates})", estimates_params))
        clauses += [
            (f"billed{i} AS ({text})", params)
            for i, (text, params) in enumerate(hooks.estimate_writes(("due r", []), clock))
        ]
    clauses += [
        (
            f"moved AS (SELECT h.{sql.column(hold, 'counter')} AS id,"  # noqa: S608
            f" SUM(CASE WHEN h.{unit} = '{customer}' THEN r.{sql.column(res, 'customer_amount')}"
            f" ELSE r.{sql.column(res, 'amount')} END) AS amount"
            f" FROM {sql.table(hold)} h JOIN due r ON h.{sql.column(hold, 'reservation')} = r.id"
            f" GROUP BY h.{sql.column(hold, 'counter')})",
            [],
        ),
        (
            f"locked AS (SELECT c.id, m.amount FROM {sql.table(counter)} c"  # noqa: S608
            f" JOIN moved m ON m.id = c.id ORDER BY c.id FOR UPDATE OF c)",
            [],
        ),
        (
            f"counted AS (UPDATE {sql.table(counter)} t"  # noqa: S608
            f" SET {reserved} = t.{reserved} - l.amount,"
            f" {spent} = t.{spent} + {'l.amount' if charge else '0'}"
            f" FROM locked l WHERE t.id = l.id)",
            [],
        ),
    ]
    text = "WITH " + ", ".join(c[0] for c in clauses) + " SELECT id FROM expired"  # noqa: S608
    return text, [p for c in clauses for p in c[1]]


@functools.cache
def _due_sql(*, db_clock: bool) -> str:
    """Elsewhere than PostgreSQL (the transaction holds the write lock): a batch of overdue
    holds, the clock first. Parameters: the HELD state, the instant unless ``db_clock``, the
    batch size."""
    clock = dbclock.now_sql() if db_clock else "%s"
    expires = sql.column(Reservation, "expires_at")
    return (
        f"SELECT {dbclock.now_sql()}, {sql.columns(Reservation, 'r')}"  # noqa: S608
        f" FROM {sql.table(Reservation)} r"
        f" WHERE r.{sql.column(Reservation, 'state')} = %s AND r.{expires} <= {clock}"
        f" ORDER BY r.{expires} LIMIT %s"
    )


@functools.cache
def _batch_holds_sql(count: int) -> str:
    """Each hold of ``count`` reservations: reservation id, counter id, unit (nothing locked)."""
    hold = ReservationHold
    return (
        f"SELECT {sql.column(hold, 'reservation')}, {sql.column(hold, 'counter')},"  # noqa: S608
        f" {sql.column(hold, 'unit')} FROM {sql.table(hold)}"
        f" WHERE {sql.column(hold, 'reservation')} IN {_in_list(count)}"
    )


@functools.cache
def _counters_by_pk_sql(count: int) -> str:
    return (
        f"SELECT {sql.columns(Counter, 'c')} FROM {sql.table(Counter)} c"  # noqa: S608
        f" WHERE c.id IN {_in_list(count)} ORDER BY c.id{sql.lock_clause(of=('c',))}"
    )


def _in_batches(
    due: QuerySet[Reservation],
    settle: Callable[[UUID], bool],
    *,
    action: str,
    batch_size: int,
) -> int:
    """Apply ``settle`` to each due reservation (one transaction each), a batch at a time, until a
    batch is short or changes nothing. Returns how many it changed."""
    changed = 0
    while True:
        with ledger_guard(action):
            batch = list(due.values_list("pk", flat=True)[:batch_size])
        changed_now = sum(settle(rid) for rid in batch)
        changed += changed_now
        if len(batch) < batch_size or changed_now == 0:
            return changed


@observed_settlement("uncertain")
@retrying_deadlocks
def reservation_mark_uncertain(reservation_id: object, *, now: datetime | None = None) -> str:
    """The call's outcome is unknown (a timeout, a lost worker): keep the hold counted, stop the
    expiry sweep from touching it, and leave it to a commit, a release or the reconcile job.
    Returns the reservation's state (unchanged unless it was HELD)."""
    rid = _reservation_id(reservation_id)
    now = now or timezone.now()
    with _locked(rid, "mark uncertain") as reservation:
        if reservation.state == ReservationState.HELD:
            reservation.state = ReservationState.UNCERTAIN
            reservation.uncertain_at = now
            reservation.save(update_fields=["state", "uncertain_at"])
        return str(reservation.state)


@retrying_deadlocks
def reservation_settle_uncertain(reservation_id: object, *, now: datetime | None = None) -> bool:
    """Settle one UNCERTAIN reservation older than ``UNCERTAIN_MAX_AGE_SECONDS`` by
    ``UNCERTAIN_SETTLE_RULE``: "charge" moves its hold to spent as an *estimated* charge and
    commits it; "release" drops it. Returns whether this call settled it."""
    rid = _reservation_id(reservation_id)
    now = now or timezone.now()
    with _locked(rid, "reconcile") as reservation:
        due = now - timedelta(seconds=conf.UNCERTAIN_MAX_AGE_SECONDS)
        if reservation.state != ReservationState.UNCERTAIN or (
            reservation.uncertain_at is not None and reservation.uncertain_at > due
        ):
            return False
        if conf.UNCERTAIN_SETTLE_RULE == "charge":
            committed = _settled(reservation, ReservationState.COMMITTED, now)
            _charge_held_as_estimated(reservation, state_write=committed, now=now)
        else:
            released = _settled(reservation, ReservationState.RELEASED, now)
            _move(
                reservation,
                reserved=-_held(reservation),
                spent=NONE,
                transition_writes=[released],
                last=True,
            )
        return True


def reservations_reconcile(*, now: datetime | None = None, batch_size: int = 500) -> int:
    """Settle every UNCERTAIN reservation past its maximum age, one transaction each. Returns how
    many were settled."""
    now = now or timezone.now()
    due = now - timedelta(seconds=conf.UNCERTAIN_MAX_AGE_SECONDS)
    return _in_batches(
        Reservation.objects.filter(
            state=ReservationState.UNCERTAIN, uncertain_at__lte=due
        ).order_by("uncertain_at"),
        lambda rid: reservation_settle_uncertain(rid, now=now),
        action="reconcile",
        batch_size=batch_size,
    )
