"""Admission: price the worst case and take a hold on every budget that applies, or on none.

The hold is taken in one transaction that locks the counter rows (``select_for_update``, in
primary-key order, so concurrent admissions cannot deadlock) and checks
``spent + reserved + amount <= limit`` on each. On SQLite, which has no row locks, the same
transaction takes the database write lock at BEGIN (``transaction_mode=IMMEDIATE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.degradation import Rung, effect_at, ladder_parse, substitutes, used_percent
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    KillSwitchActive,
    OutputCeilingRequired,
)
from llm_budgets.killswitches import kill_switches_covering, refusal_for
from llm_budgets.ledger import bound_lock_wait, bound_sqlite_wait, ledger_guard
from llm_budgets.models import Counter, KillSwitch, Reservation, ReservationHold
from llm_budgets.pricing import price_in_effect, worst_case
from llm_budgets.refusals import refusal_record
from llm_budgets.selectors import ApplicableBudget, applicable_budgets, counters_matching
from llm_budgets.tenants import end_user_ensure, tenant_get


class NoApplicableBudget(InvalidUsage):
    """No budget covers the request: admitting it would spend without any cap."""

    code = "no_budget"

    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"No budget applies to tenant {tenant!r}, so the call would be uncapped and was "
            'refused. Set one, e.g. budgets.set_limit(amount=Decimal("1000"), window="month") '
            "for a global cap.",
            field="tenant",
        )


@dataclass(frozen=True)
class _Request:
    tenant: str
    end_user: str | None
    provider: str | None
    model: str
    input_tokens: int
    max_output_tokens: int | None
    idempotency_key: str | None
    ttl: timedelta


def _validate(
    *,
    tenant: object,
    end_user: object,
    provider: object,
    model: object,
    input_tokens: object,
    max_output_tokens: object,
    idempotency_key: object,
    ttl: object,
) -> _Request:
    if ttl is None:
        ttl_delta = timedelta(seconds=conf.DEFAULT_TTL_SECONDS)
    elif isinstance(ttl, timedelta):
        ttl_delta = ttl
    elif isinstance(ttl, int) and not isinstance(ttl, bool):
        ttl_delta = timedelta(seconds=ttl)
    else:
        raise InvalidUsage(f"ttl must be seconds (int) or a timedelta, got {ttl!r}.", field="ttl")
    if not timedelta(seconds=1) <= ttl_delta <= timedelta(seconds=conf.MAX_TTL_SECONDS):
        raise InvalidUsage(
            f"ttl must be from 1 to {conf.MAX_TTL_SECONDS} seconds, "
            f"got {ttl_delta.total_seconds():g}.",
            field="ttl",
        )
    return _Request(
        tenant=validation.identifier("tenant", tenant),
        end_user=None if end_user is None else validation.identifier("end_user", end_user),
        provider=None
        if provider is None
        else validation.identifier("provider", provider, max_length=64),
        model=validation.identifier("model", model, max_length=128),
        input_tokens=validation.token_count("input_tokens", input_tokens),
        max_output_tokens=None
        if max_output_tokens is None
        else validation.token_count("max_output_tokens", max_output_tokens, allow_zero=False),
        idempotency_key=None
        if idempotency_key is None
        else validation.identifier("idempotency_key", idempotency_key),
        ttl=ttl_delta,
    )


class _MissingCounters(Exception):
    """Leaves the locking transaction so missing counters are created without holding locks."""


def reservation_create(
    *,
    tenant: object,
    end_user: object = None,
    provider: object = None,
    model: object,
    input_tokens: object,
    max_output_tokens: object = None,
    idempotency_key: object = None,
    ttl: object = None,
    allow_degrade: object = False,
    now: datetime | None = None,
) -> Reservation:
    """Admit a call: hold its worst-case cost on every budget that applies, or raise.

    Raises ``InvalidUsage`` (bad arguments), ``UnknownTenant``, ``OutputCeilingRequired``,
    ``UnknownPrice``, ``NoApplicableBudget``, ``KillSwitchActive``, ``BudgetExceeded`` or
    ``LedgerUnavailable``; in each case no hold is taken. With ``allow_degrade=True`` the plan's
    degradation ladder may grant a cheaper model or a lower output ceiling (see
    :mod:`llm_budgets.degradation`); the reservation says what was granted.
    """
    if not isinstance(allow_degrade, bool):
        raise InvalidUsage("allow_degrade must be True or False.", field="allow_degrade")
    request = _validate(
        tenant=tenant,
        end_user=end_user,
        provider=provider,
        model=model,
        input_tokens=input_tokens,
        max_output_tokens=max_output_tokens,
        idempotency_key=idempotency_key,
        ttl=ttl,
    )
    now = now or timezone.now()
    with ledger_guard("admission"):
        tenant_obj = tenant_get(request.tenant)
        if request.idempotency_key is not None:
            existing = Reservation.objects.filter(
                tenant=tenant_obj, idempotency_key=request.idempotency_key
            ).first()
            if existing is not None:
                return existing
        ceiling = request.max_output_tokens
        if ceiling is None:
            ceiling = tenant_obj.plan.default_max_output_tokens if tenant_obj.plan else None
            if ceiling is None:
                raise OutputCeilingRequired()
        price = price_in_effect(provider=request.provider, model=request.model, at=now)
        amount = worst_case(price, input_tokens=request.input_tokens, max_output_tokens=ceiling)
        user_obj = end_user_ensure(tenant_obj, request.end_user) if request.end_user else None
        applicable = applicable_budgets(tenant_obj, user_obj, now)
        if not applicable:
            raise NoApplicableBudget(request.tenant)
        ladder = (
            ladder_parse(tenant_obj.plan.degradation_ladder)
            if allow_degrade and tenant_obj.plan is not None
            else []
        )
        reservation = Reservation(
            tenant=tenant_obj,
            end_user=user_obj,
            provider=price.provider,
            model=request.model,
            price=price,
            input_tokens=request.input_tokens,
            max_output_tokens=ceiling,
            amount=amount,
            currency=price.currency,
            idempotency_key=request.idempotency_key,
            created_at=now,
            expires_at=now + request.ttl,
        )
        try:
            return _admit(reservation, applicable, ladder, request.idempotency_key)
        except (BudgetExceeded, KillSwitchActive) as refusal:
            refusal_record(refusal, reservation=reservation, now=now)
            raise


def _admit(
    reservation: Reservation,
    applicable: list[ApplicableBudget],
    ladder: list[Rung],
    idempotency_key: str | None,
) -> Reservation:
    for _attempt in range(2):
        try:
            return _hold(reservation, applicable, ladder)
        except _MissingCounters:
            Counter.objects.bulk_create(
                [
                    Counter(budget=a.budget, end_user=a.end_user, period_start=a.period.start)
                    for a in applicable
                ],
                ignore_conflicts=True,
            )
        except IntegrityError:
            if idempotency_key is None:
                raise
            # A concurrent request with the same key won the insert: return its reservation.
            return Reservation.objects.get(
                tenant_id=reservation.tenant_id, idempotency_key=idempotency_key
            )
    return _hold(reservation, applicable, ladder)


def _hold(
    reservation: Reservation, applicable: list[ApplicableBudget], ladder: list[Rung]
) -> Reservation:
    """The one transaction: refuse if a kill switch covers the request, lock the counters in pk
    order, apply the degradation ladder, check each, hold on all or raise."""
    by_key = {a.counter_key: a for a in applicable}
    bound_sqlite_wait()
    with transaction.atomic():
        bound_lock_wait()
        blocked_substitutes = _refuse_if_switched(reservation, ladder)
        reservation.save(force_insert=True)
        counters = list(
            Counter.objects.select_for_update().filter(counters_matching(applicable)).order_by("pk")
        )
        if len(counters) < len(by_key):
            raise _MissingCounters
        if ladder:
            _degrade(reservation, ladder, counters, by_key, blocked_substitutes)
        refusals = []
        for counter in counters:
            item = by_key[(counter.budget_id, counter.end_user_id, counter.period_start)]
            remaining = item.limit - counter.spent - counter.reserved
            if reservation.amount > remaining:
                refusals.append((remaining, item))
        if refusals:
            remaining, item = min(refusals, key=lambda r: r[0])
            raise _exceeded(reservation, item, remaining)
        # Exact Decimal arithmetic on the locked rows (SQL arithmetic is floating point on SQLite).
        for counter in counters:
            counter.reserved += reservation.amount
        Counter.objects.bulk_update(counters, ["reserved"])
        ReservationHold.objects.bulk_create(
            [ReservationHold(reservation=reservation, counter=c) for c in counters]
        )
    return reservation


def _refuse_if_switched(reservation: Reservation, ladder: list[Rung]) -> dict[str, KillSwitch]:
    """One query for every open switch that covers the request; raise for the first that covers
    the model asked for. Returns the switches that only block a ladder substitute, by model."""
    requested = reservation.model
    switches = kill_switches_covering(
        tenant_id=reservation.tenant_id,
        end_user_id=reservation.end_user_id,
        provider=reservation.provider,
        models={requested, *substitutes(ladder, requested)},
        now=reservation.created_at,
    )
    blocked: dict[str, KillSwitch] = {}
    for switch in switches:
        if switch.model in ("", requested):
            raise _switched(reservation, switch)
        blocked.setdefault(switch.model, switch)
    return blocked


def _switched(reservation: Reservation, switch: KillSwitch) -> KillSwitchActive:
    return refusal_for(
        switch,
        tenant=reservation.tenant.external_id,
        end_user=reservation.end_user.external_id if reservation.end_user else None,
        model=reservation.requested_model or reservation.model,
    )


def _degrade(
    reservation: Reservation,
    ladder: list[Rung],
    counters: list[Counter],
    by_key: dict[tuple[int, int | None, datetime], ApplicableBudget],
    blocked_substitutes: dict[str, KillSwitch],
) -> None:
    """Apply the rungs in force, read from the counters this transaction has locked. A changed
    model is repriced here, so the caller checks the budgets with the amount actually held."""
    used = used_percent(
        (c.spent + c.reserved, by_key[(c.budget_id, c.end_user_id, c.period_start)].limit)
        for c in counters
    )
    effect = effect_at(
        ladder, used, model=reservation.model, max_output_tokens=reservation.max_output_tokens
    )
    if not effect.changes(reservation.model, reservation.max_output_tokens):
        return
    if effect.model in blocked_substitutes:
        raise _switched(reservation, blocked_substitutes[effect.model])
    price = reservation.price
    if effect.model != reservation.model:
        price = price_in_effect(
            provider=reservation.provider, model=effect.model, at=reservation.created_at
        )
    reservation.requested_model = reservation.model
    reservation.model = effect.model
    reservation.price = price
    reservation.max_output_tokens = effect.max_output_tokens
    reservation.amount = worst_case(
        price, input_tokens=reservation.input_tokens, max_output_tokens=effect.max_output_tokens
    )
    reservation.degraded = True
    reservation.save(
        update_fields=[
            "requested_model",
            "model",
            "price",
            "max_output_tokens",
            "amount",
            "degraded",
        ]
    )


def _exceeded(
    reservation: Reservation, item: ApplicableBudget, remaining: Decimal
) -> BudgetExceeded:
    budget = item.budget
    return BudgetExceeded(
        scope=budget.scope_label,
        window=budget.window,
        limit=item.limit,
        remaining=max(Decimal(0), remaining),
        requested=reservation.amount,
        resets_at=item.period.end,
        currency=budget.currency,
        budget_id=budget.pk,
        tenant=reservation.tenant.external_id,
        end_user=reservation.end_user.external_id if reservation.end_user else None,
    )
