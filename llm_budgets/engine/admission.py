"""Admission: price the worst case and take a hold on every budget that applies, or on none.

The hold is taken in one transaction that locks the counter rows (``select_for_update``, in
primary-key order, so concurrent admissions cannot deadlock) and checks
``spent + reserved + amount <= limit`` on each. On SQLite, which has no row locks, the same
transaction takes the database write lock at BEGIN (``transaction_mode=IMMEDIATE``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, OperationalError, connection

from llm_budgets.conf import conf
from llm_budgets.control.killswitches import kill_switches_covering, refusal_for
from llm_budgets.control.refusals import refusal_record
from llm_budgets.db import dbclock
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import (
    DEADLOCK_RETRIES,
    bound_lock_wait,
    deadlock_retried,
    deadlocked,
    ledger_guard,
    ledger_transaction,
    lock_timeout_statement,
)
from llm_budgets.db.ledger import (
    PendingConfiguration,
    configuration_pending,
    ledger_connection,
)
from llm_budgets.degradation import Rung, effect_at, ladder_parse, substitutes, used_percent
from llm_budgets.engine import stripes
from llm_budgets.engine.applicable import admission_context, applicable_budgets, shared_by_tenants
from llm_budgets.engine.counters import (
    Bucket,
    counters_from,
    counters_locking,
    picked_from,
    rolling_buckets,
    rows_by_key,
    stripes_picking,
)
from llm_budgets.engine.first_sight import FirstSight
from llm_budgets.engine.types import ApplicableBudget, CallScopes, CounterKey
from llm_budgets.events import observed_admission
from llm_budgets.exceptions import (
    BudgetExceeded,
    ConfigurationUncommitted,
    IdempotencyKeyReused,
    KillSwitchActive,
    LedgerUnavailable,
    NoApplicableBudget,
    RunClosed,
    UnknownTenant,
)
from llm_budgets.models import (
    ApiKey,
    Budget,
    Counter,
    CreditAccount,
    EndUser,
    KillSwitch,
    PricingBasis,
    Reservation,
    ReservationHold,
    Run,
)
from llm_budgets.money import ZERO
from llm_budgets.pricing.estimates import Estimate, input_token_count, request_estimate
from llm_budgets.request import Request
from llm_budgets.tenancy.runs import run_refuse_if_closed
from llm_budgets.tenancy.tenants import tenant_with_end_user, tenant_with_plan
from llm_budgets.windows import rolling_window


class _MissingCounters(Exception):
    """Leaves the locking transaction so missing counters are created without holding locks.
    Private to ``_admit``, which always handles it."""


class _Escalate(Exception):
    """Leaves the fast or waiting path's transaction (releasing the stripes it took) when a hot
    budget has no stripe with room: ``_admit`` then takes the exact path. Never escalate while
    holding a stripe: waiting for the other stripes while holding one is how deadlocks start."""


class _Busy(Exception):
    """Leaves the fast path's transaction when a hot budget has stripes with room but every one
    is busy: ``_admit`` runs it again on the waiting path, which waits for one stripe of each
    hot budget (``stripes``: by key, the one the fast path took or saw busy), locked with the
    other counters in pk order."""

    def __init__(self, stripes: dict[CounterKey, int]) -> None:
        super().__init__()
        self.stripes = stripes


# What leaves the locking transaction before it wrote anything (a retry on another path, a
# refusal), unless it created rows first: ``ledger_transaction`` then commits instead of rolling
# back.
_UNWRITTEN = (_Busy, _Escalate, _MissingCounters, BudgetExceeded, KillSwitchActive, RunClosed)


def reservation_create(
    *,
    tenant: object,
    end_user: object = None,
    provider: object = None,
    model: object,
    input_tokens: object = None,
    max_output_tokens: object = None,
    idempotency_key: object = None,
    ttl: object = None,
    messages: object = None,
    prompt: object = None,
    max_tool_calls: object = None,
    allow_degrade: object = False,
    tags: object = None,
    run: object = None,
    api_key: ApiKey | None = None,
    now: datetime | None = None,
    service_tier: object = None,
    new_key: bool = False,
) -> Reservation:
    """:func:`reservation_admit` of the :class:`~llm_budgets.request.Request` these fields
    describe (checked there, as every door's)."""
    fields: dict[str, Any] = {
        "tenant": tenant,
        "end_user": end_user,
        "provider": provider,
        "model": model,
        "input_tokens": input_tokens,
        "max_output_tokens": max_output_tokens,
        "idempotency_key": idempotency_key,
        "ttl": ttl,
        "messages": messages,
        "prompt": prompt,
        "max_tool_calls": max_tool_calls,
        "allow_degrade": allow_degrade,
        "tags": tags,
        "run": run,
        "service_tier": service_tier,
    }
    return reservation_admit(Request(**fields), api_key=api_key, now=now, new_key=new_key)


@contextmanager
def _uncommitted_refused(pending: PendingConfiguration | None, tenant: str) -> Iterator[None]:
    """A tenant the ledger does not know, where the caller's open transaction wrote
    configuration, is most likely that transaction's own: say so rather than "unknown"."""
    try:
        yield
    except UnknownTenant:
        if pending is None:
            raise
        raise ConfigurationUncommitted(tenant) from None


@observed_admission
def reservation_admit(
    call: Request,
    *,
    api_key: ApiKey | None = None,
    now: datetime | None = None,
    new_key: bool = False,
) -> Reservation:
    """Admit a call: hold its worst-case cost on every budget that applies, or raise.

    Raises ``InvalidUsage`` (bad arguments: ``Request.checked``), ``UnknownTenant``,
    ``OutputCeilingRequired``, ``UnknownPrice``, ``NoApplicableBudget``, ``KillSwitchActive``,
    ``BudgetExceeded`` or ``LedgerUnavailable`` (or ``RunClosed``: the run named was closed; or
    ``IdempotencyKeyReused``: the key belongs to a different request); in each case no hold is
    taken. A retry with the key of an earlier call that asks the same gets that reservation.
    ``run`` (a run id, created on first sight) brings in the run's budgets and tags those
    of each tag named (``set_limit(tag=(key, value))``). With ``allow_degrade=True`` the plan's
    degradation ladder may grant a cheaper model or a lower output ceiling (see
    :mod:`llm_budgets.degradation`); the reservation says what was granted. ``api_key``: the
    REST API key the call came through, so kill switches on that key and its budgets apply.
    ``new_key``: the caller made the idempotency key for this call just now (the guards' first
    attempt), so no earlier call can have it: it is not looked up before the hold (a query saved;
    a key taken meanwhile still meets the unique constraint, as any race does).
    """
    request = call.checked()
    assert request.tenant is not None  # checked
    tag_map = dict(request.tags or {})
    tier = request.service_tier or ""
    run_id = request.run
    input_tokens = input_token_count(
        provider=request.provider,
        model=request.model,
        input_tokens=request.input_tokens,
        messages=request.messages,
        prompt=request.prompt,
    )
    ttl = request.lifetime
    given = dbclock.given_or_none(now)
    # Read on the caller's connection: configuration its open transaction wrote, which the
    # ledger's connection cannot see (``ConfigurationUncommitted``).
    pending = configuration_pending()
    with (
        ledger_guard("admission"),
        ledger_connection(),
        _uncommitted_refused(pending, request.tenant),
    ):
        scopes = CallScopes(api_key=api_key, tags=tuple(sorted(tag_map.items())))
        # The common call, a known end user and a named provider: one statement reads all that
        # is needed before the transaction (the run it names, the database's clock included).
        # Otherwise one read at a time.
        context = None
        user_obj: EndUser | None
        run_obj: Run | None = None
        if request.end_user is not None and request.provider is not None:
            context = admission_context(
                tenant=request.tenant,
                end_user=request.end_user,
                provider=request.provider,
                model=request.model,
                at=given,
                scopes=scopes,
                run=run_id,
            )
        if context is not None:
            now = context.at
            tenant_obj, user_obj, run_obj = context.tenant, context.end_user, context.run
        else:
            now = given or dbclock.database_now()
            if request.end_user is not None and request.provider is not None:
                # The end user's first call: it is created below, once the call is valid.
                tenant_obj, user_obj = tenant_with_plan(request.tenant), None
            else:
                tenant_obj, user_obj = tenant_with_end_user(request.tenant, request.end_user)
        if pending is not None and pending.covers(tenant_obj.pk):
            raise ConfigurationUncommitted(request.tenant)
        if run_id is not None and run_obj is None and context is None:
            run_obj = Run.objects.filter(tenant=tenant_obj, external_id=run_id).first()
        # A run not seen yet is created once the key is checked; its budgets are then read on
        # their own.
        run_unseen = run_id is not None and run_obj is None
        if run_obj is not None:
            run_obj.tenant = tenant_obj
            # Checked again inside the hold's transaction, once the run's counter is locked.
            run_refuse_if_closed(run_obj)
        asked = None
        if request.idempotency_key is not None:
            asked = _Asked(
                key=request.idempotency_key,
                end_user_id=user_obj.pk if user_obj is not None else None,
                unseen=(request.end_user is not None and user_obj is None, run_unseen),
                run_id=run_obj.pk if run_obj is not None else None,
                provider=request.provider,
                model=request.model,
                input_tokens=input_tokens,
                max_output_tokens=request.max_output_tokens,
                tags=tag_map,
                service_tier=tier,
            )
            existing = None if new_key else _reservation_with_key(tenant_obj.pk, asked.key)
            if existing is not None:
                return asked.replay(existing)
        # An end user or run not seen yet is created by the transaction that admits the call,
        # never by a refused one (``engine.first_sight``); until then it has no id, so only the
        # "*" budgets apply to it.
        first_sight = FirstSight(
            end_user=EndUser(tenant=tenant_obj, external_id=request.end_user)
            if request.end_user is not None and user_obj is None
            else None,
            run=Run(tenant=tenant_obj, external_id=run_id)
            if run_id is not None and run_unseen
            else None,
        )
        if first_sight.run is not None:
            run_obj = first_sight.run
        if run_obj is not None:
            scopes = replace(scopes, run=run_obj)
        tool_calls = dict(request.max_tool_calls or {})
        estimate = request_estimate(
            tenant_obj,
            provider=request.provider,
            model=request.model,
            input_tokens=input_tokens,
            max_output_tokens=request.max_output_tokens,
            start=now,
            end=now + ttl,
            max_tool_calls=tool_calls,
            in_effect=context.price if context is not None else None,
            service_tier=tier,
        )
        if first_sight.end_user is not None:
            user_obj = first_sight.end_user
        if context is not None and not run_unseen:
            applicable = context.applicable
        else:
            applicable = applicable_budgets(tenant_obj, user_obj, now, scopes)
        if not applicable:
            raise NoApplicableBudget(request.tenant)
        ladder = (
            ladder_parse(tenant_obj.plan.degradation_ladder)
            if request.allow_degrade and tenant_obj.plan is not None
            else []
        )
        reservation = sql.new(
            Reservation,
            tenant=tenant_obj,
            end_user=user_obj,
            run=run_obj,
            provider=estimate.price.provider
            if estimate.pricing_basis == PricingBasis.PRICE and estimate.price
            else request.provider or "",
            model=request.model,
            price=estimate.price,
            pricing_basis=estimate.pricing_basis,
            service_tier=tier,
            input_tokens=input_tokens,
            max_output_tokens=estimate.max_output_tokens,
            max_tool_calls=tool_calls,
            amount=estimate.amount,
            markup_percent=estimate.markup_percent,
            customer_amount=estimate.customer_amount,
            currency=conf.CURRENCY,
            idempotency_key=request.idempotency_key,
            tags=tag_map,
            created_at=now,
            expires_at=now + ttl,
        )
        _tolerance(reservation, estimate)
        degrade = _Degrade(ladder, ttl, tool_calls, tier) if ladder else None
        try:
            return _admit(
                reservation,
                applicable,
                degrade,
                asked,
                api_key.pk if api_key is not None else None,
                switches_open=context.any_switch_open if context is not None else True,
                first_sight=first_sight,
            )
        except (BudgetExceeded, KillSwitchActive) as refusal:
            if asked is not None:
                # The reservation is inserted after the checks: a concurrent request with the
                # same key may have been admitted first, and its hold be what refused this one.
                # It committed before this transaction could lock the counters, so it is there.
                first = _reservation_with_key(tenant_obj.pk, asked.key)
                if first is not None:
                    return asked.replay(first)
            refusal_record(
                refusal, reservation=reservation, end_user=request.end_user, run=run_id, now=now
            )
            raise


def _reservation_with_key(tenant_id: int, idempotency_key: str) -> Reservation | None:
    return Reservation.objects.filter(tenant_id=tenant_id, idempotency_key=idempotency_key).first()


@dataclass(frozen=True)
class _Asked:
    """What a call with an idempotency key asked for, which a retry with that key must ask
    again: the same end user, run, provider (if named), model, token counts and tags. Not
    compared: the amount (a price change between the call and its retry moves it; the tokens
    and model it is priced from are compared), the TTL and ``allow_degrade``."""

    key: str
    end_user_id: int | None
    # Whether it names an end user, a run, not seen yet: no reservation can have them.
    unseen: tuple[bool, bool]
    run_id: int | None
    provider: str | None
    model: str
    input_tokens: int
    max_output_tokens: int | None
    tags: dict[str, str]
    service_tier: str

    def replay(self, existing: Reservation) -> Reservation:
        """``existing``, the reservation the key belongs to, if this call asks for the same;
        else ``IdempotencyKeyReused`` naming what differs."""
        same = {
            "end_user": existing.end_user_id == self.end_user_id and not self.unseen[0],
            "run": existing.run_id == self.run_id and not self.unseen[1],
            "provider": self.provider is None or existing.provider == self.provider,
            "model": (existing.requested_model or existing.model) == self.model,
            "input_tokens": existing.input_tokens == self.input_tokens,
            # A degraded hold may carry a lower ceiling than was asked.
            "max_output_tokens": self.max_output_tokens is None
            or existing.degraded
            or existing.max_output_tokens == self.max_output_tokens,
            "tags": existing.tags == self.tags,
            # A dearer tier asked on retry must not ride a hold priced at the cheaper one.
            "service_tier": existing.service_tier == self.service_tier,
        }
        differs = [name for name, equal in same.items() if not equal]
        if differs:
            raise IdempotencyKeyReused(
                idempotency_key=self.key,
                reservation_id=str(existing.pk),
                differs=", ".join(differs),
            )
        return existing


@dataclass(frozen=True)
class _Degrade:
    """What admission needs to reprice a request the degradation ladder changes."""

    ladder: list[Rung]
    ttl: timedelta
    max_tool_calls: dict[str, int] | None
    service_tier: str = ""


def _admit(
    reservation: Reservation,
    applicable: list[ApplicableBudget],
    degrade: _Degrade | None,
    asked: _Asked | None,
    api_key_id: str | None = None,
    *,
    switches_open: bool = True,
    first_sight: FirstSight | None = None,
) -> Reservation:
    """Run the locking transaction (``_hold``), settling the races it cannot settle inside:

    - a hot budget's stripes with room are all busy (``_Busy``): the transaction runs again on
      the waiting path, which waits for one of them instead of skipping it.
    - a hot budget has no stripe with room (``_Escalate``): the transaction runs again on the
      exact path, every stripe locked and the whole cap's numbers decided on.
    - a counter row is missing (the first call of a period, or of a hot budget's stripe): the
      transaction runs once more, creating the rows first, before it locks anything (a
      concurrent creator's row is as good: conflicts are ignored), so a refused call leaves no
      counter behind. A call naming an end user or run not seen yet creates it (and its
      counters) that way from the first attempt (``first_sight``). Rows still missing then, or
      a row that cannot be created, mean a budget was removed meanwhile: the call is refused
      (``LedgerUnavailable``, retry).
    - the insert of a reservation whose idempotency key a concurrent request took first: that
      request's reservation is returned (``IdempotencyKeyReused`` if it asked for another).

    Any other ``IntegrityError`` is a fault and propagates (``ledger_guard`` logs it).
    """
    exact = False
    waits: dict[CounterKey, int] | None = None
    # Whether the transaction creates what is missing: the call's new end user or run, and
    # the counters of every budget that applies.
    create = bool(first_sight)
    deadlocks = 0
    # At most: the fast path, the waiting path, the exact path, missing stripes created, the
    # exact path again; and each of those again if PostgreSQL rolled it back as a deadlock's
    # victim.
    for attempt in range(5 + DEADLOCK_RETRIES):
        try:
            # A retry follows a rolled back attempt: read switches afresh.
            open_ = switches_open or attempt > 0
            return _hold(
                reservation,
                applicable,
                degrade,
                api_key_id,
                switches_open=open_,
                exact=exact,
                waits=waits,
                create=create,
                first_sight=first_sight,
            )
        except _Busy as busy:
            waits = busy.stripes
        except _Escalate:
            exact = True
        except _MissingCounters:
            if create:
                break
            create = True
        except OperationalError as exc:
            if not deadlocked(exc) or deadlocks == DEADLOCK_RETRIES:
                raise
            deadlocks += 1
            deadlock_retried("admission", deadlocks)
        except IntegrityError as exc:
            if asked is not None:
                won = _reservation_with_key(reservation.tenant_id, asked.key)
                if won is not None:
                    return asked.replay(won)
            if not _references_gone(exc):
                raise
            break
    raise LedgerUnavailable(
        "The budgets that apply to this call changed while it was admitted (a budget, end "
        "user or counter was removed). The call was refused; retry it.",
        retry_after=1,
    )


def _references_gone(exc: IntegrityError) -> bool:
    """Whether ``exc`` is a foreign key violation: a row the hold refers to was deleted by a
    concurrent transaction (PostgreSQL SQLSTATE 23503, SQLite's extended code 787)."""
    cause = exc.__cause__
    return (
        getattr(cause, "sqlstate", None) == "23503"
        or getattr(cause, "sqlite_errorcode", None) == 787
        or "FOREIGN KEY constraint failed" in str(exc)
    )


def _hold(
    reservation: Reservation,
    applicable: list[ApplicableBudget],
    degrade: _Degrade | None,
    api_key_id: str | None = None,
    *,
    switches_open: bool = True,
    exact: bool = False,
    waits: dict[CounterKey, int] | None = None,
    create: bool = False,
    first_sight: FirstSight | None = None,
) -> Reservation:
    """The one transaction, in named steps: bound lock waits; with ``create``, the call's new
    end user and run (``first_sight``) and every missing counter row, before anything is locked;
    refuse if a kill switch covers the request (``switches_open``: whether any may, as read just
    before); lock the rolling budgets, then the counters, in pk order; read what each budget has
    used; apply the degradation ladder; refuse if any budget cannot take the amount; hold on
    all. A rolled back attempt forgets the ids of what it created (``FirstSight.forget``).

    Hot budgets (``engine.stripes``). On the fast path (neither ``exact`` nor ``waits``) each
    takes one of its stripes with room, skipping busy ones, after every other counter is locked
    (so no wait happens while a stripe is held); a hot budget with none free raises ``_Busy``
    (some have room) or ``_Escalate`` (none has), which roll the transaction back. On the
    waiting path (``waits``: a stripe id for each hot budget) those stripes are locked with the
    other counters in pk order, waiting as for any counter, and taken if they still have room
    (else ``_Escalate``). On the exact path every stripe is locked with the other counters in
    pk order (the canonical order), the cap is decided on its whole sum, and its allowances
    are split again for its current effective limit. A call that may degrade takes the exact
    path (the ladder reads the whole cap's use).

    A rolling budget is checked against the sum of its window's buckets, and the hold lands on
    the current bucket. Its buckets move with time, so admissions to it serialise on the budget
    row itself, locked (in pk order) before any counter: every path that locks both takes budgets
    first, so the order stays canonical and deadlock-free.
    """
    by_key = {a.counter_key: a for a in applicable}
    rolling_ids = sorted(a.budget.pk for a in applicable if rolling_window(a.budget.window))
    hot = (
        [] if exact or degrade is not None else [a for a in applicable if stripes.striped(a.budget)]
    )
    waited = [a for a in hot if waits is not None and a.counter_key in waits]
    fast = [a for a in hot if a not in waited]
    locked = [a for a in applicable if a not in hot]
    waited_ids = [waits[a.counter_key] for a in waited] if waits is not None else []
    # Built before the counters are locked, which then stay locked for the checks, one write
    # and the commit. A degraded request is built again.
    insert_reservation = None if create else sql.inserting([reservation])
    try:
        with ledger_transaction(unwritten=() if create else _UNWRITTEN, bounded=False):
            # The bound on lock waits comes first, in the round trip of the transaction's first
            # statement: the kill switch read, the rolling budgets' lock (alone) or the
            # counters'.
            bound = lock_timeout_statement()
            if insert_reservation is None:
                # Creating waits for a concurrent creator of the same row: bounded too. Nothing
                # is locked yet, so the lock order below is untouched.
                bound_lock_wait()
                bound = None
                if first_sight:
                    first_sight.create(reservation)
                    by_key = {a.counter_key: a for a in applicable}  # now with their ids
                _counters_create(applicable)
                insert_reservation = sql.inserting([reservation])
            blocked_substitutes = (
                _refuse_if_switched(
                    reservation, degrade.ladder if degrade else [], api_key_id, first=bound
                )
                if switches_open
                else {}
            )
            if rolling_ids and not switches_open:
                bound_lock_wait()
            _lock_budgets(rolling_ids)
            # One round trip (where psycopg pipelines), each its own statement, in this order:
            # the bound on lock waits (unless sent above); the counters' lock (with the waiting
            # path's stripes); the fast path's
            # stripe pick, which starts only once those counters are held (no wait while a
            # stripe is held); the read of the run's close, once every counter it has is locked.
            batch = [] if switches_open or rolling_ids else [bound]
            if locked or waited_ids:
                batch.append(counters_locking(locked, waited_ids))
            amounts = {a.counter_key: reservation.amount_for(a.budget.unit) for a in hot}
            if fast:
                batch.append(stripes_picking([(a, amounts[a.counter_key]) for a in fast]))
            run_read = _run_closed_read(reservation.run)
            if run_read is not None:
                batch.append(run_read)
            balances_read = _balances_read(locked)
            if balances_read is not None:
                batch.append(balances_read)
            results = sql.fetch_each([s for s in batch if s is not None])
            if balances_read is not None:
                _balances_refresh(locked, results.pop())
            run_rows = results.pop() if run_read is not None else []
            picked_rows = results.pop() if fast else []
            counters = counters_from(results.pop()) if locked or waited_ids else []
            ids = set(waited_ids)
            rows = rows_by_key([c for c in counters if c.pk not in ids])
            if any(not _complete(rows.get(a.counter_key), a) for a in locked):
                raise _MissingCounters
            picked = _stripes_picked(fast, amounts, picked_from(picked_rows))
            picked += _with_room(waited, amounts, [c for c in counters if c.pk in ids])
            _refuse_if_run_closed(reservation.run, run_rows)
            windows = rolling_buckets(applicable) if rolling_ids else {}
            used = _used(rows, windows)
            if degrade is not None and _degrade(
                reservation,
                degrade,
                [(spent, by_key[key].limit) for key, spent in used.items()],
                blocked_substitutes,
            ):
                insert_reservation = sql.inserting([reservation])
            _refuse_if_exceeding(reservation, by_key, used, windows)
            _take_holds(reservation, rows, picked, by_key, insert_reservation)
    except BaseException:
        if first_sight is not None:
            first_sight.forget(reservation)  # rolled back: whatever it created is gone
        raise
    return reservation


def _balances_read(locked: list[ApplicableBudget]) -> sql.Statement | None:
    """A prepaid balance's limit read again once its counter is locked (the same round trip):
    a lowering (expiry, refund) commits under that lock, so the limit read with the context may
    be stale by then. None when no balance applies: other limits are not re-read."""
    ids = [a.budget.pk for a in locked if a.budget.prepaid]
    if not ids:
        return None
    text = (
        f"SELECT {sql.columns(Budget, 'b')} FROM {sql.table(Budget)} b "  # noqa: S608
        f"WHERE b.{sql.column(Budget, 'id')} IN ({', '.join(['%s'] * len(ids))})"
    )
    return text, ids


def _balances_refresh(locked: list[ApplicableBudget], rows: list[Any]) -> None:
    fresh = {budget.pk: budget.limit for budget in (sql.row_to(Budget, row) for row in rows)}
    for item in locked:
        if item.budget.pk in fresh:
            item.budget.limit = fresh[item.budget.pk]


def _counters_create(applicable: list[ApplicableBudget]) -> None:
    """Every counter row of ``applicable`` (each stripe of a hot budget), in one statement, in
    the order of their keys (concurrent creators insert in one order: no deadlock); rows that
    exist are left alone."""
    rows = [a.counter_key.counter(n) for a in applicable for n in stripes.stripe_numbers(a)]
    rows.sort(key=_creation_order)
    Counter.objects.bulk_create(rows, ignore_conflicts=True)


def _creation_order(counter: Counter) -> tuple[object, ...]:
    key = CounterKey.of(counter)
    return (*((value is None, str(value or "")) for value in key), counter.stripe)


def _complete(rows: list[Counter] | None, item: ApplicableBudget) -> bool:
    """Whether every row of a budget's key exists: one, or each stripe of a striped one."""
    if not rows:
        return False
    return {c.stripe for c in rows} >= set(stripes.stripe_numbers(item))


def _stripes_picked(
    fast: list[ApplicableBudget],
    amounts: dict[CounterKey, Decimal],
    rows: tuple[list[Counter], list[Counter]],
) -> list[Counter]:
    """The fast path: the stripes ``stripes_picking`` locked, one with room of each hot budget;
    ``_Busy`` if a budget's stripes with room were all busy, ``_Escalate`` if one has none."""
    picked, busy = rows
    by_key = {CounterKey.of(c): c for c in picked}
    if any(item.counter_key not in by_key for item in fast):
        by_key.update((CounterKey.of(c), c) for c in busy)
        if all(item.counter_key in by_key for item in fast):
            raise _Busy({item.counter_key: by_key[item.counter_key].pk for item in fast})
    return _with_room(fast, amounts, picked)


def _with_room(
    items: list[ApplicableBudget], amounts: dict[CounterKey, Decimal], rows: list[Counter]
) -> list[Counter]:
    """``rows``, one locked stripe of each budget in ``items`` that can take its amount within
    its allowance, split for the budget's effective limit; else ``_Escalate`` (on the waiting
    path: another call took the room meanwhile, or the stripes were split again). Checked here in
    exact ``Decimal`` (SQLite compares decimals as floats)."""
    by_key = {CounterKey.of(c): c for c in rows}
    for item in items:
        stripe = by_key.get(item.counter_key)
        if (
            stripe is None
            or stripe.allowance is None
            or stripe.split_for != item.limit
            or stripes.used(stripe) + amounts[item.counter_key] > stripe.allowance
        ):
            raise _Escalate
    return rows


def _run_closed_read(run: Run | None) -> sql.Statement | None:
    """The read of the run's close, sent right after the counters' lock statement (same round
    trip where psycopg pipelines): it starts once the counters are held, so it sees a close
    committed while they were awaited. No row is locked for it."""
    if run is None:
        return None
    return _run_closed_sql(), [run.pk]


def _refuse_if_run_closed(run: Run | None, rows: list[tuple[object, ...]]) -> None:
    """Refuse if ``_run_closed_read`` found the run closed. ``runs.run_close`` locks the run's
    counters before it commits, so a close either committed before this transaction got them
    (read here: refused) or waits for this hold to commit (admitted before the close). A run
    call locks only its run counter more than a call without one."""
    if run is not None and rows:
        locked = sql.row_to(Run, rows[0])
        locked.tenant = run.tenant
        run_refuse_if_closed(locked)


@functools.cache
def _run_closed_sql() -> str:
    return f"SELECT {sql.columns(Run, 'r')} FROM {sql.table(Run)} r WHERE r.id = %s"  # noqa: S608


def _lock_budgets(rolling_ids: list[int]) -> None:
    """Lock the rolling budgets' rows, in pk order, before any counter. NO KEY UPDATE:
    serialises admissions without blocking inserts of new bucket counters, which key-share
    lock the budget row for their foreign key."""
    if not rolling_ids:
        return
    no_key = connection.features.has_select_for_no_key_update
    list(
        Budget.objects.select_for_update(no_key=no_key)
        .filter(pk__in=rolling_ids)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _used(
    rows: dict[CounterKey, list[Counter]], windows: dict[CounterKey, list[Bucket]]
) -> dict[CounterKey, Decimal]:
    """Spent plus reserved of each locked key (summed over its stripes), or of its rolling
    window's buckets."""
    used = {}
    for key, counters in rows.items():
        buckets = windows.get(key)
        if buckets is None:
            used[key] = sum((stripes.used(c) for c in counters), ZERO)
        else:
            used[key] = sum((b.spent + b.reserved for b in buckets), ZERO)
    return used


def _refuse_if_exceeding(
    reservation: Reservation,
    by_key: dict[CounterKey, ApplicableBudget],
    used: dict[CounterKey, Decimal],
    windows: dict[CounterKey, list[Bucket]],
) -> None:
    """Raise ``BudgetExceeded`` for the budget with the least room, if any cannot take the
    amount (in its own unit)."""
    refusals = []
    for key, spent in used.items():
        item = by_key[key]
        remaining = item.limit - spent
        if reservation.amount_for(item.budget.unit) > remaining:
            refusals.append((remaining, item, windows.get(key)))
    if refusals:
        remaining, item, buckets = min(refusals, key=lambda r: r[0])
        raise _exceeded(reservation, item, remaining, buckets)


def _take_holds(
    reservation: Reservation,
    rows: dict[CounterKey, list[Counter]],
    picked: list[Counter],
    by_key: dict[CounterKey, ApplicableBudget],
    insert_reservation: sql.Statement,
) -> None:
    """Hold the amount on one row of every budget, each in its budget's unit (provider cost or
    customer price), with exact Decimal arithmetic on the locked rows (SQL arithmetic is
    floating point on SQLite): on the stripe the fast path picked, else on the lowest row of
    the key, whose stripes (all locked) are then split again for the budget's effective limit
    (a hot budget) or forgotten (one no longer hot). The reservation, its holds and the
    counters go in one round trip (one statement on PostgreSQL); the counters stay locked for
    that and the commit."""
    holds = []
    written = list(picked)
    split = False
    for key, counters in rows.items():
        counter = stripes.target(counters)
        unit = by_key[key].budget.unit
        counter.reserved += reservation.amount_for(unit)
        holds.append(sql.new(ReservationHold, reservation=reservation, counter=counter, unit=unit))
        budget = by_key[key].budget
        if stripes.striped(budget):
            stripes.resplit(counters, by_key[key].limit, budget.stripes)
            written += counters
            split = True
        elif stripes.unsplit(counters):
            written += counters
            split = True
        else:
            written.append(counter)
    for counter in picked:
        unit = by_key[CounterKey.of(counter)].budget.unit
        counter.reserved += reservation.amount_for(unit)
        holds.append(sql.new(ReservationHold, reservation=reservation, counter=counter, unit=unit))
    fields = ["reserved", "allowance", "split_for"] if split else ["reserved"]
    # The transaction's last statement: committed with it where that saves a round trip.
    Counter.objects.write(
        written, fields, transition_writes=[insert_reservation, sql.inserting(holds)], commit=True
    )


def _refuse_if_switched(
    reservation: Reservation,
    ladder: list[Rung],
    api_key_id: str | None = None,
    *,
    first: sql.Statement | None = None,
) -> dict[str, KillSwitch]:
    """One query for every open switch that covers the request (sent with ``first``); raise for
    the first that covers the model asked for. Returns the switches that only block a ladder
    substitute, by model."""
    requested = reservation.model
    # A switch on the priced model also covers the other spellings of its name.
    priced = {reservation.price.model} if reservation.price is not None else set()
    switches = kill_switches_covering(
        tenant_id=reservation.tenant_id,
        end_user_id=reservation.end_user_id,
        provider=reservation.provider,
        models={requested, *priced, *substitutes(ladder, _ladder_name(ladder, reservation))},
        now=reservation.created_at,
        api_key_id=api_key_id,
        run_id=reservation.run_id,
        first=first,
    )
    blocked: dict[str, KillSwitch] = {}
    for switch in switches:
        if switch.model in ("", requested, *priced):
            raise _switched(reservation, switch)
        blocked.setdefault(switch.model, switch)
    return blocked


def _switched(reservation: Reservation, switch: KillSwitch) -> KillSwitchActive:
    return refusal_for(
        switch,
        tenant=reservation.tenant.external_id,
        end_user=reservation.end_user.external_id if reservation.end_user else None,
        model=reservation.requested_model or reservation.model,
        run=reservation.run.external_id if reservation.run else None,
    )


def _degrade(
    reservation: Reservation,
    degrade: _Degrade,
    usage: list[tuple[Decimal, Decimal]],
    blocked_substitutes: dict[str, KillSwitch],
) -> bool:
    """Apply the rungs in force at the usage read from the counters this transaction has locked.
    A changed request is repriced here (same provider, same plan policies), so the caller checks
    the budgets with the amounts actually held. Returns whether the request changed."""
    name = _ladder_name(degrade.ladder, reservation)
    effect = effect_at(
        degrade.ladder,
        used_percent(usage),
        model=name,
        max_output_tokens=reservation.max_output_tokens,
    )
    if effect.model == name:  # not substituted: the name asked for stays as it was spelled
        effect = replace(effect, model=reservation.model)
    if not effect.changes(reservation.model, reservation.max_output_tokens):
        return False
    if effect.model in blocked_substitutes:
        raise _switched(reservation, blocked_substitutes[effect.model])
    estimate = request_estimate(
        reservation.tenant,
        provider=reservation.provider or None,
        model=effect.model,
        input_tokens=reservation.input_tokens,
        max_output_tokens=effect.max_output_tokens,
        start=reservation.created_at,
        end=reservation.created_at + degrade.ttl,
        max_tool_calls=degrade.max_tool_calls,
        service_tier=degrade.service_tier,
    )
    reservation.requested_model = reservation.model
    reservation.model = effect.model
    reservation.price = estimate.price
    reservation.pricing_basis = estimate.pricing_basis
    reservation.max_output_tokens = estimate.max_output_tokens
    reservation.amount = estimate.amount
    reservation.customer_amount = estimate.customer_amount
    _tolerance(reservation, estimate)
    reservation.degraded = True
    return True


def _tolerance(reservation: Reservation, estimate: Estimate) -> None:
    """Keep the estimate's input tolerance on the reservation (not stored) for its refusal."""
    reservation.input_tolerance = estimate.input_tolerance
    reservation.customer_input_tolerance = estimate.customer_input_tolerance


def _ladder_name(ladder: list[Rung], reservation: Reservation) -> str:
    """The name a ladder knows the request's model by: as asked, else the priced model's name
    (a dated or prefixed spelling of a model the ladder names, llm_budgets.pricing.model_names)."""
    asked = reservation.model
    if reservation.price is None or any(asked in rung.models for rung in ladder):
        return asked
    return reservation.price.model


def _exceeded(
    reservation: Reservation,
    item: ApplicableBudget,
    remaining: Decimal,
    buckets: list[Bucket] | None = None,
) -> BudgetExceeded:
    budget = item.budget
    resets_at = item.period.end
    window = rolling_window(budget.window)
    if window is not None and buckets is not None:
        # When enough of the window's spend and holds drop out for this request to fit.
        resets_at = window.fits_at(
            [(b.start, b.spent + b.reserved) for b in buckets],
            reservation.amount_for(budget.unit) - remaining,
        )
    requested = reservation.amount_for(budget.unit)
    shared = shared_by_tenants(budget.scope)
    if requested > item.limit and not shared:
        resets_at = None  # no reset makes room for it: no Retry-After that invites a retry
    return BudgetExceeded(
        scope=item.scope_label,
        window=budget.window,
        limit=item.limit,
        remaining=max(Decimal(0), remaining),
        requested=requested,
        resets_at=resets_at,
        currency=budget.currency,
        budget_id=budget.pk,
        tenant=reservation.tenant.external_id,
        end_user=reservation.end_user.external_id if reservation.end_user else None,
        shared=shared,
        period_start=item.period.start,
        prepaid=budget.prepaid,
        top_up_url=_top_up_url(budget) if budget.prepaid else "",
        input_tolerance=reservation.input_tolerance_for(budget.unit),
    )


def _top_up_url(budget: Budget) -> str:
    """Where the refused tenant tops up its balance (read on refusal only)."""
    url = CreditAccount.objects.filter(budget_id=budget.pk).values_list("top_up_url", flat=True)
    return next(iter(url), "")
