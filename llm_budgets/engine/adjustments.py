"""Staff corrections to the ledger, always as compensating ``adjustment`` lines.

Nothing is edited or deleted: voiding a line adds its opposite on the same reservation (so it
reaches every counter the reservation was charged to); resetting an end user's (a run's, a tag
or API key budget's) period spend adds one line on each of its own counters. A void that would
take a counter a reset already brought lower below zero stops it at zero, with a line of that
counter recording the difference (the floor rule, ``engine.lines.floor_line``). Conservation
(``reconcile.counters_drift``) stays exact. Every line is built by ``engine.lines``.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Sum
from django.utils import timezone

from llm_budgets import hooks
from llm_budgets.control.self_serve import TenantAdmin, self_serve_authorize
from llm_budgets.db.boundary import ledger_guard, ledger_transaction
from llm_budgets.engine import lines as ledger_lines
from llm_budgets.engine.applicable import applicable_budgets
from llm_budgets.engine.counters import counters_matching
from llm_budgets.engine.types import ApplicableBudget, CallScopes
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    ApiKey,
    AuditEvent,
    Budget,
    Counter,
    EndUser,
    Reservation,
    ReservationHold,
    ReservationState,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.money import ZERO
from llm_budgets.tenancy.runs import run_ensure, run_validate
from llm_budgets.tenancy.tenants import tenant_get
from llm_budgets.windows import rolling_window, tenant_period


def _reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise InvalidUsage("reason is required for a ledger correction.", field="reason")
    return reason.strip()


@ledger_guard("adjustments")
def usage_void(
    *, record_id: int, reason: str, actor: str = "", now: datetime | None = None
) -> UsageRecord:
    """Cancel a charge or true-up line with an adjustment of the opposite cost. Once per line."""
    why = _reason(reason)
    now = now or timezone.now()
    with ledger_transaction():
        line = UsageRecord.objects.filter(pk=record_id).first()
        if line is None or line.reservation_id is None:
            raise InvalidUsage(f"No charge line has id {record_id}.", field="record_id")
        if line.kind == UsageKind.ADJUSTMENT:
            raise InvalidUsage("An adjustment cannot be voided; add another.", field="record_id")
        if line.cost < 0 or line.customer_cost < 0:
            # A downward true-up gave money back: "voiding" it would charge again, past the
            # limit its room may since have been admitted to, with no call behind it.
            raise InvalidUsage(
                f"Line {record_id} is a refund (a true-up down to the reported usage): a void "
                "cancels a charge, so there is nothing to void here.",
                field="record_id",
            )
        # Lock the reservation first, as settlement does, so a late commit cannot interleave.
        reservation = Reservation.objects.select_for_update(of=("self",)).get(
            pk=line.reservation_id
        )
        if reservation.state == ReservationState.EXPIRED:
            raise InvalidUsage(
                "The reservation expired and a late commit may still true it up; void its line "
                "once it has settled.",
                field="record_id",
            )
        if UsageRecord.objects.filter(voids=line).exists():
            raise InvalidUsage(f"Line {record_id} is already voided.", field="record_id")
        # A call is never given back more than it was charged: after a refund (a late release
        # or a true-up down), its estimate line is voided only down to what the call still nets.
        net = (
            UsageRecord.objects.filter(reservation=reservation)
            .spend()
            .aggregate(cost=Sum("cost"), customer=Sum("customer_cost"))
        )
        give_back = (
            max(ZERO, min(line.cost, net["cost"] or ZERO)),
            max(ZERO, min(line.customer_cost, net["customer"] or ZERO)),
        )
        if give_back[0] <= 0 and give_back[1] <= 0:
            raise InvalidUsage(
                f"Line {record_id}'s call was already given back all it was charged (a refund on "
                "a late settlement): there is nothing left to void.",
                field="record_id",
            )
        units = dict(
            ReservationHold.objects.filter(reservation=reservation).values_list("counter", "unit")
        )
        counters = list(
            Counter.objects.select_for_update().filter(pk__in=list(units)).order_by("pk")
        )
        adjustment = ledger_lines.reversal_line(line, now=now)
        adjustment.cost, adjustment.customer_cost = -give_back[0], -give_back[1]
        floors = []
        # Exact Decimal arithmetic on the locked rows; each counter in its hold's unit. A counter
        # a reset already brought lower stops at zero (the floor rule, ledger_lines.floor_line).
        for counter in counters:
            counter.spent += adjustment.cost_for(units[counter.pk])
            floor = ledger_lines.floor_line(
                counter,
                units[counter.pk],
                tenant_id=line.tenant_id,
                end_user_id=line.end_user_id,
                currency=line.currency,
                reserved_at=line.reserved_at,
                now=now,
            )
            if floor is not None:
                floors.append(floor)
        Counter.objects.bulk_update(counters, ["spent"])
        adjustment.save()
        for floor in floors:
            floor.save()
        hooks.line_written(adjustment)
        AuditEvent.objects.create(
            action="usage.void",
            actor=actor,
            tenant_id=line.tenant_id,
            target=f"usage line {line.pk} ({line.kind}, reservation {reservation.pk})",
            before={"cost": str(line.cost)},
            after={
                "adjustment_id": adjustment.pk,
                "lines": [adjustment.pk, *(f.pk for f in floors)],
                "cost": str(adjustment.cost),
                # Counters a reset had already brought lower: stopped at zero (floor rule).
                "floored": ledger_lines.floored(floors),
            },
            reason=why,
        )
    return adjustment


@ledger_guard("adjustments")
def end_user_spend_reset(
    *,
    end_user: EndUser,
    reason: str,
    actor: str = "",
    now: datetime | None = None,
    acting: TenantAdmin | None = None,
) -> list[UsageRecord]:
    """Bring the end user's spend for the current period back to zero on its own budgets and on
    its share of each-end-user (``"*"``) budgets, one adjustment line per counter. Holds in
    flight stay held. The tenant's and the global budgets are untouched: that money was spent.
    ``acting``: a tenant admin resetting one of their own users (control/self_serve.py)."""
    now = now or timezone.now()
    tenant = end_user.tenant
    if acting is not None:
        self_serve_authorize(acting, action="reset_spend", tenant=tenant)
        actor = acting.actor
    # The end user's own budgets and its share of each "*" budget: never the tenant's or global.
    mine = [
        a
        for a in applicable_budgets(tenant, end_user, now)
        if a.budget.scope in (Scope.END_USER, Scope.END_USER_DEFAULT)
    ]
    return _spend_reset(
        mine,
        tenant=tenant,
        end_user=end_user,
        action="end_user.reset_spend",
        target=f"end user {tenant.external_id}/{end_user.external_id}",
        reason=reason,
        actor=actor,
        now=now,
    )


@ledger_guard("adjustments")
def run_spend_reset(
    *, tenant: str, run: str, reason: str, actor: str = "", now: datetime | None = None
) -> list[UsageRecord]:
    """Give a run its budget back: its spend on its own budgets and on its share of each-run
    (``"*"``) budgets goes back to zero, one adjustment line per counter (a lifetime window
    included). Holds in flight stay held; the tenant's and other budgets are untouched."""
    now = now or timezone.now()
    tenant_obj = tenant_get(tenant)
    run_obj = run_ensure(tenant_obj, run_validate(run))
    run_obj.tenant = tenant_obj
    scopes = CallScopes(run=run_obj)
    mine = [
        a
        for a in applicable_budgets(tenant_obj, None, now, scopes)
        if a.budget.scope in (Scope.RUN, Scope.RUN_DEFAULT)
    ]
    return _spend_reset(
        mine,
        tenant=tenant_obj,
        end_user=None,
        action="run.reset_spend",
        target=str(run_obj),
        reason=reason,
        actor=actor,
        now=now,
    )


@ledger_guard("adjustments")
def budget_spend_reset(
    *,
    budget: Budget,
    api_key: ApiKey | None = None,
    reason: str,
    actor: str = "",
    now: datetime | None = None,
) -> list[UsageRecord]:
    """Give a tag or API key budget its current period back: the spend on its counter (for an
    each-key ``"*"`` budget, ``api_key``'s share) goes back to zero, one adjustment line, one
    audit event. Holds in flight stay held; every other budget keeps the spend."""
    now = now or timezone.now()
    if budget.scope not in (Scope.TAG, Scope.API_KEY, Scope.API_KEY_DEFAULT):
        raise InvalidUsage(
            f"Only a tag or API key budget is reset here; {budget.scope_label} is not one "
            "(an end user's or a run's spend has its own reset).",
            field="budget",
        )
    if (budget.scope == Scope.API_KEY_DEFAULT) != (api_key is not None):
        raise InvalidUsage(
            "An each-key (*) budget is reset for one key: name it (and only then).",
            field="api_key",
        )
    tenant = budget.tenant
    if tenant is None:  # these scopes always have one (a database constraint): never reached
        raise InvalidUsage(f"Budget {budget.pk} has no tenant.", field="budget")
    if api_key is not None and api_key.tenant_id not in (None, tenant.pk):
        raise InvalidUsage("The API key acts for another tenant.", field="api_key")
    target = budget.scope_label if api_key is None else f"API key {api_key.prefix}"
    return _spend_reset(
        [ApplicableBudget(budget, tenant_period(budget.window, now, tenant), api_key=api_key)],
        tenant=tenant,
        end_user=None,
        action="budget.reset_spend",
        target=f"{target} ({budget.window} budget {budget.pk})",
        reason=reason,
        actor=actor,
        now=now,
    )


def _spend_reset(
    applicable: list[ApplicableBudget],
    *,
    tenant: Tenant,
    end_user: EndUser | None,
    action: str,
    target: str,
    reason: str,
    actor: str,
    now: datetime,
) -> list[UsageRecord]:
    """Zero the current period's spend of ``applicable``'s counters, with an adjustment line
    each and one audit event. Rolling windows are left alone: their spend leaves by itself."""
    why = _reason(reason)
    mine = [a for a in applicable if rolling_window(a.budget.window) is None]
    lines = []
    with ledger_transaction():
        counters = (
            list(
                Counter.objects.select_for_update()
                .filter(counters_matching(mine), spent__gt=0)
                .select_related("budget")
                .order_by("pk")
            )
            if mine
            else []
        )
        before: dict[str, str] = {}
        for counter in counters:
            before[str(counter.pk)] = str(counter.spent)
            lines.append(
                ledger_lines.counter_line(
                    counter,
                    unit=counter.budget.unit,
                    amount=-counter.spent,
                    tenant_id=tenant.pk,
                    end_user_id=end_user.pk if end_user is not None else None,
                    currency=counter.budget.currency,
                    reserved_at=counter.period_start,  # the period the reset lands in
                    now=now,
                )
            )
        for line in lines:
            line.save()
            hooks.line_written(line)
        AuditEvent.objects.create(
            action=action,
            actor=actor,
            tenant=tenant,
            target=target,
            before={"spent_by_counter": before},
            after={"spent_by_counter": {k: "0" for k in before}, "lines": [x.pk for x in lines]},
            reason=why,
        )
        for counter in counters:
            counter.spent = ZERO
        Counter.objects.bulk_update(counters, ["spent"])
    return lines
