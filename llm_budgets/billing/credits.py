"""Prepaid balances: open one, add credit, expire it, take back a refund, adjust. The only writer
of ``CreditAccount``, ``CreditLot`` and a balance's limit.

A balance is a tenant budget with a ``lifetime`` window, unit customer price, ``prepaid=True``:
admission holds the worst case against it like any limit and commit draws the true cost. Its
limit is the sum of its lots' live parts (``amount - forfeited``), rewritten by every change here.

**Order of use** (docs/billing.md, "Prepaid balances"): spend is attributed to lots promotional
first, then soonest-expiring first (no expiry last), then oldest first; a lot already expired
counts as used up to its live part. When a lot expires, it forfeits what that attribution leaves
unused, so the limit never drops below what is spent and held.

**Locks**: the balance's lifetime counter first (as admission and settlement lock it), then the
account row. Every change here takes both, so changes to one balance are serialised with each
other and with the counter's admissions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.engine.balances import recharge_rules_clear
from llm_budgets.exceptions import InvalidUsage, NoBalance
from llm_budgets.models import (
    AuditEvent,
    Budget,
    BudgetUnit,
    Counter,
    CreditAccount,
    CreditLot,
    LotKind,
    LotSource,
    Scope,
    Tenant,
    TopUp,
    TopUpKind,
    TopUpState,
    Window,
)
from llm_budgets.money import ZERO, currency_places, display
from llm_budgets.tenancy.tenants import tenant_get
from llm_budgets.windows import LIFETIME_START


def balance_open(
    *,
    tenant: str,
    currency: str | None = None,
    top_up_url: str = "",
    actor: str = "",
    reason: str = "",
) -> CreditAccount:
    """Make ``tenant``'s spending prepaid: a lifetime tenant budget at customer price whose limit
    is its credit (0 until the first top-up or grant). Opening it again changes only the top-up
    URL. Refused if the tenant already has a lifetime budget that is not a balance."""
    row = tenant_get(tenant)
    currency = conf.CURRENCY if currency is None else currency
    if currency != conf.CURRENCY:
        raise InvalidUsage(
            f"currency must be the installation's, {conf.CURRENCY}, got {currency!r}: limits and "
            "prices are in one currency.",
            field="currency",
        )
    if not isinstance(top_up_url, str) or len(top_up_url) > 500:
        raise InvalidUsage(
            "top_up_url must be a URL of at most 500 characters.", field="top_up_url"
        )
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=row.pk).get()
        account = CreditAccount.objects.filter(tenant=row).first()
        if account is not None:
            if account.top_up_url != top_up_url:
                account.top_up_url = top_up_url
                account.save(update_fields=["top_up_url"])
            return account
        existing = Budget.objects.filter(
            scope=Scope.TENANT, tenant=row, window=Window.LIFETIME
        ).first()
        if existing is not None:
            raise InvalidUsage(
                f"Tenant {row.external_id} already has a lifetime budget ({existing}) that is not "
                "a prepaid balance: remove it before opening a balance.",
                field="tenant",
            )
        budget = Budget.objects.create(
            scope=Scope.TENANT,
            tenant=row,
            window=Window.LIFETIME,
            limit=ZERO,
            currency=currency,
            unit=BudgetUnit.CUSTOMER_PRICE,
            prepaid=True,
            warning_thresholds=[],
        )
        account = CreditAccount.objects.create(
            tenant=row, budget=budget, currency=currency, top_up_url=top_up_url
        )
        AuditEvent.objects.create(
            action="credits.open",
            actor=actor,
            tenant=row,
            target=f"balance of {row.external_id}",
            after={"currency": currency, "budget_id": budget.pk},
            reason=reason,
        )
    return account


def account_of(tenant: Tenant | str) -> CreditAccount:
    """The tenant's balance account, or ``NoBalance``."""
    row = tenant if isinstance(tenant, Tenant) else tenant_get(tenant)
    account = CreditAccount.objects.select_related("tenant", "budget").filter(tenant=row).first()
    if account is None:
        raise NoBalance(
            f"Tenant {row.external_id} has no prepaid balance: open one (balance_open).",
            field="tenant",
        )
    return account


def _lock(account: CreditAccount) -> tuple[CreditAccount, Counter]:
    """The balance's lifetime counter, then its account, locked (in a transaction)."""
    counter, _ = Counter.objects.select_for_update().get_or_create(
        budget_id=account.budget_id,
        end_user=None,
        run=None,
        api_key=None,
        period_start=LIFETIME_START,
        stripe=0,
    )
    locked = (
        CreditAccount.objects.select_for_update(of=("self",))
        .select_related("tenant", "budget")
        .get(pk=account.pk)
    )
    return locked, counter


def _sync_limit(account: CreditAccount) -> Decimal:
    """Write the sum of live lots as the balance's limit (callers hold the locks)."""
    total = CreditLot.objects.filter(account=account).aggregate(
        live=Sum(F("amount") - F("forfeited"))
    )["live"]
    limit = Decimal(total or 0)
    Budget.objects.filter(pk=account.budget_id).update(limit=limit)
    account.budget.limit = limit
    return limit


def _rearm(account: CreditAccount, counter: Counter) -> None:
    """Arm auto-recharge again once credit lifts the balance back to its threshold."""
    below = account.recharge_below
    if account.recharge_armed or below is None:
        return
    if account.budget.limit - counter.spent - counter.reserved >= below:
        account.recharge_armed = True
        account.save(update_fields=["recharge_armed"])


def recharge_set(
    *,
    tenant: str,
    below: object,
    amount: object,
    daily_max: object = None,
    actor: str = "",
    reason: str = "",
) -> CreditAccount:
    """Auto-recharge: when the balance falls below ``below``, charge ``amount`` to the saved card
    off-session, at most ``daily_max`` (default: ``amount``) per UTC day. ``below=None`` turns it
    off. Audited."""
    account = account_of(tenant)
    places = currency_places(account.currency)
    if below is None:
        values: dict[str, object] = {
            "recharge_below": None,
            "recharge_amount": None,
            "recharge_daily_max": None,
        }
    else:
        threshold = validation.money("below", below)
        charge = validation.money("amount", amount, places=places)
        if charge <= 0:
            raise InvalidUsage("amount must be more than 0.", field="amount")
        cap = charge if daily_max is None else validation.money("daily_max", daily_max)
        if cap < charge:
            raise InvalidUsage(
                f"daily_max {display(cap)} is less than one recharge of {display(charge)}: no "
                "recharge could ever run. Raise it or lower amount.",
                field="daily_max",
            )
        values = {"recharge_below": threshold, "recharge_amount": charge, "recharge_daily_max": cap}
    with transaction.atomic():
        locked, counter = _lock(account)
        before = {
            k: None if v is None else str(v)
            for k, v in (
                ("recharge_below", locked.recharge_below),
                ("recharge_amount", locked.recharge_amount),
                ("recharge_daily_max", locked.recharge_daily_max),
            )
        }
        for key, value in values.items():
            setattr(locked, key, value)
        locked.recharge_armed = False
        locked.save(update_fields=[*values, "recharge_armed"])
        _rearm(locked, counter)
        pending = TopUp.objects.filter(
            account=locked, kind=TopUpKind.RECHARGE, state=TopUpState.PENDING
        )
        if locked.recharge_below is None:
            # Turned off: a recharge queued under the old rule is not paid.
            pending.update(state=TopUpState.SKIPPED, error="auto-recharge turned off")
        elif not locked.recharge_armed and not pending.exists():
            # Already below the threshold: this is its crossing.
            TopUp.objects.create(
                account=locked,
                kind=TopUpKind.RECHARGE,
                amount=locked.recharge_amount,
                currency=locked.currency,
                created_at=timezone.now(),
            )
        AuditEvent.objects.create(
            action="credits.recharge_rule",
            actor=actor,
            tenant=locked.tenant,
            target=f"balance of {locked.tenant.external_id}",
            before=before,
            after={k: None if v is None else str(v) for k, v in values.items()},
            reason=reason,
        )
    transaction.on_commit(recharge_rules_clear)
    return locked


@dataclass(frozen=True)
class BalanceState:
    """Where a balance stands: its credit (the limit), what is spent and held, what is left."""

    currency: str
    credit: Decimal
    spent: Decimal
    held: Decimal

    @property
    def available(self) -> Decimal:
        return max(ZERO, self.credit - self.spent - self.held)


def balance_state(account: CreditAccount) -> BalanceState:
    """The balance now (a read: for pages, the API and reconciliation)."""
    counter = Counter.objects.filter(
        budget_id=account.budget_id, period_start=LIFETIME_START, end_user=None
    ).first()
    limit = Budget.objects.values_list("limit", flat=True).get(pk=account.budget_id)
    return BalanceState(
        currency=account.currency,
        credit=limit,
        spent=counter.spent if counter else ZERO,
        held=counter.reserved if counter else ZERO,
    )


def _expiry(value: object, now: datetime) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidUsage(
            f"expires_at must be an aware datetime, got {value!r}.", field="expires_at"
        )
    if value <= now:
        raise InvalidUsage(
            f"expires_at {value.isoformat()} is not in the future: credit that expires at once "
            "adds nothing.",
            field="expires_at",
        )
    return value


def credit_add(
    *,
    account: CreditAccount,
    amount: object,
    kind: str = LotKind.PAID,
    source: str = LotSource.GRANT,
    expires_at: object = None,
    top_up: TopUp | None = None,
    actor: str = "",
    reason: str = "",
    now: datetime | None = None,
) -> CreditLot:
    """Add a lot of credit to the balance and raise its limit, audited. Promotional credit may
    expire; paid credit expires only if ``expires_at`` is given (the operator's choice)."""
    now = now or timezone.now()
    if kind not in LotKind.values:
        raise InvalidUsage(
            f"kind must be one of {', '.join(LotKind.values)}, got {kind!r}.", field="kind"
        )
    value = validation.money("amount", amount)
    if value <= 0:
        raise InvalidUsage("amount must be more than 0.", field="amount")
    expiry = _expiry(expires_at, now)
    with transaction.atomic():
        locked, counter = _lock(account)
        lot = CreditLot.objects.create(
            account=locked,
            kind=kind,
            source=source,
            amount=value,
            expires_at=expiry,
            top_up=top_up,
            actor=actor,
            reason=reason,
            created_at=now,
        )
        before = locked.budget.limit
        after = _sync_limit(locked)
        _rearm(locked, counter)
        AuditEvent.objects.create(
            action="credits.add",
            actor=actor,
            tenant=locked.tenant,
            target=f"balance of {locked.tenant.external_id}",
            before={"credit": str(before)},
            after={
                "credit": str(after),
                "lot": lot.pk,
                "kind": kind,
                "source": source,
                "amount": str(value),
                "expires_at": expiry.isoformat() if expiry else None,
            },
            reason=reason,
        )
    return lot


def _order_of_use(lot: CreditLot) -> tuple[object, ...]:
    """Expired lots first (used up to their live part), then promotional, soonest-expiring,
    oldest."""
    far = datetime.max.replace(tzinfo=LIFETIME_START.tzinfo)
    return (
        lot.expired_at is None,
        lot.kind != LotKind.PROMOTIONAL,
        lot.expires_at or far,
        lot.created_at,
        lot.pk,
    )


def attribution(lots: list[CreditLot], used: Decimal) -> dict[int, Decimal]:
    """How much of ``used`` (spent + held) each lot covers, in order of use."""
    left = used
    covered: dict[int, Decimal] = {}
    for lot in sorted(lots, key=_order_of_use):
        take = min(lot.amount - lot.forfeited, max(ZERO, left))
        covered[lot.pk] = take
        left -= take
    return covered


def credits_expire(*, now: datetime | None = None) -> int:
    """Expire every lot whose ``expires_at`` has passed: each forfeits what the order of use
    leaves unused of it. Returns how many lots expired. (Daily job; safe to run any time.)"""
    now = now or timezone.now()
    due = (
        CreditLot.objects.filter(expires_at__lte=now, expired_at__isnull=True)
        .order_by("expires_at", "pk")
        .values_list("account_id", flat=True)
    )
    expired = 0
    for account_id in dict.fromkeys(due):
        account = CreditAccount.objects.select_related("budget").get(pk=account_id)
        with transaction.atomic():
            locked, counter = _lock(account)
            lots = list(CreditLot.objects.select_for_update().filter(account=locked))
            before = locked.budget.limit
            for lot in sorted(lots, key=lambda x: (x.expires_at is None, x.expires_at, x.pk)):
                if lot.expires_at is None or lot.expires_at > now or lot.expired_at is not None:
                    continue
                covered = attribution(lots, counter.spent + counter.reserved)
                unused = lot.amount - lot.forfeited - covered[lot.pk]
                lot.forfeited += unused
                lot.expired_at = now
                lot.save(update_fields=["forfeited", "expired_at"])
                expired += 1
            after = _sync_limit(locked)
            AuditEvent.objects.create(
                action="credits.expire",
                actor="credits expiry",
                tenant=locked.tenant,
                target=f"balance of {locked.tenant.external_id}",
                before={"credit": str(before)},
                after={"credit": str(after)},
                reason=f"credit lots expired at {now.isoformat()}",
            )
    return expired


@dataclass(frozen=True)
class TakeBack:
    """What a refund or dispute did to the balance: taken from it, and what it could not take
    because it was already spent or held (``unrecovered``, for the host to collect)."""

    taken: Decimal
    unrecovered: Decimal


def top_up_take_back(
    *, top_up: TopUp, refunded_total: object, actor: str, reason: str, now: datetime | None = None
) -> TakeBack:
    """Record that ``refunded_total`` of a credited top-up went back to the customer (a refund
    or dispute; cumulative, so a repeated event changes nothing) and lower the balance by the
    new part, never below what is spent and held: the rest is ``unrecovered`` (audited)."""
    now = now or timezone.now()
    total = validation.money("refunded_total", refunded_total)
    with transaction.atomic():
        # The top-up's row first, as crediting takes it (billing/topups.py), then the balance.
        row = TopUp.objects.select_for_update().get(pk=top_up.pk)
        account = CreditAccount.objects.select_related("budget").get(pk=top_up.account_id)
        locked, counter = _lock(account)
        total = min(total, row.amount)
        new = total - row.refunded
        if new <= 0:
            return TakeBack(ZERO, ZERO)
        lot = CreditLot.objects.select_for_update().filter(top_up=row).first()
        room = max(ZERO, locked.budget.limit - counter.spent - counter.reserved)
        taken = min(new, room, lot.amount - lot.forfeited) if lot else ZERO
        if lot is not None and taken > 0:
            lot.forfeited += taken
            lot.save(update_fields=["forfeited"])
        row.refunded = total
        row.unrecovered += new - taken
        row.save(update_fields=["refunded", "unrecovered"])
        before = locked.budget.limit
        after = _sync_limit(locked)
        AuditEvent.objects.create(
            action="credits.take_back",
            actor=actor,
            tenant=locked.tenant,
            target=f"top-up {row.pk} of {locked.tenant.external_id}",
            before={"credit": str(before), "refunded": str(total - new)},
            after={
                "credit": str(after),
                "refunded": str(total),
                "taken": str(taken),
                "unrecovered": str(new - taken),
            },
            reason=reason,
        )
    return TakeBack(taken, new - taken)


def balance_adjust(
    *,
    tenant: str,
    amount: object,
    direction: str,
    actor: str,
    reason: str,
    kind: str = LotKind.PAID,
    expires_at: object = None,
    now: datetime | None = None,
) -> Decimal:
    """Staff correction: ``direction="add"`` adds a lot; ``"remove"`` forfeits from live lots in
    reverse order of use (paid, latest-expiring first), never below what is spent and held.
    Needs a reason. Returns the new credit."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidUsage("A balance adjustment needs a reason.", field="reason")
    account = account_of(tenant)
    if direction == "add":
        credit_add(
            account=account,
            amount=amount,
            kind=kind,
            source=LotSource.ADJUSTMENT,
            expires_at=expires_at,
            actor=actor,
            reason=reason,
            now=now,
        )
        return account_of(tenant).budget.limit
    if direction != "remove":
        raise InvalidUsage(
            f"direction must be 'add' or 'remove', got {direction!r}.", field="direction"
        )
    value = validation.money("amount", amount)
    with transaction.atomic():
        locked, counter = _lock(account)
        room = locked.budget.limit - counter.spent - counter.reserved
        if value > room:
            raise InvalidUsage(
                f"Cannot remove {display(value)} {locked.currency}: only {display(max(ZERO, room))}"
                " is neither spent nor held. Remove at most that.",
                field="amount",
            )
        left = value
        lots = list(CreditLot.objects.select_for_update().filter(account=locked))
        for lot in sorted(lots, key=_order_of_use, reverse=True):
            take = min(left, lot.amount - lot.forfeited)
            if take > 0:
                lot.forfeited += take
                lot.save(update_fields=["forfeited"])
                left -= take
        before = locked.budget.limit
        after = _sync_limit(locked)
        AuditEvent.objects.create(
            action="credits.remove",
            actor=actor,
            tenant=locked.tenant,
            target=f"balance of {locked.tenant.external_id}",
            before={"credit": str(before)},
            after={"credit": str(after), "removed": str(value)},
            reason=reason,
        )
    return after


def minor_units(amount: Decimal, currency: str) -> int:
    """``amount`` in the currency's minor units (cents), refused unless whole."""
    scaled = amount * (10 ** currency_places(currency))
    if scaled != scaled.to_integral_value():
        raise InvalidUsage(
            f"{display(amount)} {currency} is not a whole number of "
            f"{'cents' if currency_places(currency) else 'units'}: Stripe takes minor units.",
            field="amount",
        )
    return int(scaled)


def from_minor_units(value: int, currency: str) -> Decimal:
    return Decimal(value).scaleb(-currency_places(currency))
