"""Prepaid balances: open one, add credit, expire it, take back a refund, adjust. The only writer
of ``CreditAccount``, ``CreditLot`` and a balance's limit.

A balance is a tenant budget with a ``lifetime`` window, unit customer price, ``prepaid=True``:
admission holds the worst case against it like any limit and commit draws the true cost. Its
limit is the sum of its lots' live parts (``amount - forfeited``), rewritten by every change here.

**Order of use** (docs/billing.md, "Prepaid balances"): spend is attributed to lots promotional
first, then soonest-expiring first (no expiry last), then oldest first; a lot already expired
counts as used up to its live part. When a lot expires, it forfeits everything that attribution
leaves unspent, held or not: the limit may then fall below spent + held, and no call is admitted
until there is room again (a hold on expired credit that commits becomes debt).

**Take-backs**: a refund and a dispute of a top-up each take back their own amount from its lot
(the top-up's ``refunded`` and ``disputed``, each set from Stripe's figure, so a redelivered
event changes nothing and neither hides the other), spent or not; what the lot no longer has is
``unrecovered``. Spent credit taken back is **debt**: the balance shows it (``BalanceState.debt``)
and the next credit pays it first. A won dispute gives its amount back.

**Locks**: the balance's lifetime counter first (as admission and settlement lock it), then the
account row. Every change here takes both, so changes to one balance are serialised with each
other and with the counter's admissions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import F, QuerySet, Sum
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.billing.balances import recharge_rules_clear
from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_guard, ledger_transaction
from llm_budgets.exceptions import InvalidUsage, NoBalance
from llm_budgets.models import (
    AuditEvent,
    Budget,
    BudgetUnit,
    Counter,
    CreditAccount,
    CreditLot,
    DisputeStatus,
    LotKind,
    LotSource,
    Scope,
    Tenant,
    TopUp,
    TopUpKind,
    TopUpState,
    Window,
)
from llm_budgets.models.credits import LOT_PAID, LOT_UNEXPIRED
from llm_budgets.money import ZERO, currency_places, display
from llm_budgets.tenancy.tenants import tenant_get
from llm_budgets.windows import LIFETIME_START


@ledger_guard("prepaid balance")
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


@ledger_guard("read")
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


@ledger_guard("prepaid balance")
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
    """Where a balance stands: its credit (the limit), what is spent and held, what is left,
    and what is owed.

    ``available`` is what new calls may still hold (never below 0); ``debt`` is what was spent
    beyond the credit (an expiry or a take-back that found the credit spent or held, a call's
    overage), paid first by the next credit. Both are 0 when the balance is exactly used up."""

    currency: str
    credit: Decimal
    spent: Decimal
    held: Decimal

    @property
    def available(self) -> Decimal:
        return max(ZERO, self.credit - self.spent - self.held)

    @property
    def debt(self) -> Decimal:
        return max(ZERO, self.spent - self.credit)


@ledger_guard("read")
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


@dataclass(frozen=True)
class Deposit:
    """A lot added, and how much of it paid the balance's debt first (0 without debt)."""

    lot: CreditLot
    debt_paid: Decimal


@ledger_guard("prepaid credit")
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
    return credit_deposit(
        account=account,
        amount=amount,
        kind=kind,
        source=source,
        expires_at=expires_at,
        top_up=top_up,
        actor=actor,
        reason=reason,
        now=now,
    ).lot


def credit_deposit(
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
) -> Deposit:
    """:func:`credit_add`, saying how much of the lot paid the balance's debt first: a balance
    spent past its credit owes that, and the new credit covers it before anything else (the
    limit rises by the whole lot; what is left to spend is the lot less the debt)."""
    now = now or timezone.now()
    if kind not in LotKind.values:
        raise InvalidUsage(
            f"kind must be one of {', '.join(LotKind.values)}, got {kind!r}.", field="kind"
        )
    value = validation.money("amount", amount)
    if value <= 0:
        raise InvalidUsage("amount must be more than 0.", field="amount")
    expiry = _expiry(expires_at, now)
    with ledger_transaction():
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
        debt_paid = min(value, max(ZERO, counter.spent - before))
        after = _sync_limit(locked)
        _rearm(locked, counter)
        AuditEvent.objects.create(
            action="credits.add",
            actor=actor,
            tenant=locked.tenant,
            target=f"balance of {locked.tenant.external_id}",
            before={"credit": str(before), "debt": str(max(ZERO, counter.spent - before))},
            after={
                "credit": str(after),
                "lot": lot.pk,
                "kind": kind,
                "source": source,
                "amount": str(value),
                "expires_at": expiry.isoformat() if expiry else None,
                "debt_paid": str(debt_paid),
            },
            reason=reason,
        )
    return Deposit(lot, debt_paid)


def order_of_use(lot: CreditLot) -> tuple[object, ...]:
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


def lots_last_used_first(account: CreditAccount) -> QuerySet[CreditLot]:
    """The account's lots with credit left to forfeit, in reverse order of use (``order_of_use``
    reversed), as ``llmb_lot_last_used_first`` orders them: PostgreSQL reads only the lots a
    slice of it returns, however many the account has had."""
    return CreditLot.objects.filter(account=account, amount__gt=F("forfeited")).order_by(
        LOT_UNEXPIRED.desc(),
        LOT_PAID.desc(),
        F("expires_at").desc(nulls_first=True),  # no expiry: the latest of all
        F("created_at").desc(),
        F("id").desc(),
    )


def _forfeit_last_used(account: CreditAccount, amount: Decimal, chunk: int = 16) -> None:
    """Forfeit ``amount`` from the account's lots last used first, reading and locking ``chunk``
    lots at a time, so that a removal touches the newest lots only: reading them all made it
    slower with every top-up the account ever had, while it held the balance's locks (callers
    hold them). Lots a chunk used up fall out of the next read."""
    lots = lots_last_used_first(account).select_for_update(of=("self",))
    left = amount
    while left > 0:
        rows = list(lots[:chunk])
        for lot in rows:
            take = min(left, lot.amount - lot.forfeited)
            lot.forfeited += take
            lot.save(update_fields=["forfeited"])
            left -= take
            if left <= 0:
                return
        if len(rows) < chunk:
            return


def attribution(lots: list[CreditLot], used: Decimal) -> dict[int, Decimal]:
    """How much of ``used`` each lot covers, in order of use."""
    left = used
    covered: dict[int, Decimal] = {}
    for lot in sorted(lots, key=order_of_use):
        take = min(lot.amount - lot.forfeited, max(ZERO, left))
        covered[lot.pk] = take
        left -= take
    return covered


@ledger_guard("credit expiry")
def credits_expire(*, now: datetime | None = None) -> int:
    """Expire every lot whose ``expires_at`` has passed: each forfeits all that the order of use
    leaves unspent of it, held or not (a hold is not spending: released, it must not make
    expired credit spendable again). Returns how many lots expired; each expires once (its
    ``expired_at``). The limit may fall below spent + held. (Daily job; safe to run any
    time.)"""
    now = now or timezone.now()
    due = (
        CreditLot.objects.filter(expires_at__lte=now, expired_at__isnull=True)
        .order_by("expires_at", "pk")
        .values_list("account_id", flat=True)
    )
    expired = 0
    for account_id in dict.fromkeys(due):
        account = CreditAccount.objects.select_related("budget").get(pk=account_id)
        with ledger_transaction():
            locked, counter = _lock(account)
            lots = list(CreditLot.objects.select_for_update().filter(account=locked))
            before = locked.budget.limit
            # Read once: a lot expired here keeps exactly what it covers and moves ahead in
            # the order of use, where every lot is used up, so what each covers stays the same.
            covered = attribution(lots, counter.spent)
            for lot in sorted(lots, key=lambda x: (x.expires_at is None, x.expires_at, x.pk)):
                if lot.expires_at is None or lot.expires_at > now or lot.expired_at is not None:
                    continue
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
    """What a refund or dispute event did to the balance: ``taken`` from the top-up's lot (the
    limit fell by it, into debt if it was spent), ``unrecovered`` (gone back to the payer but no
    longer in the lot to take: it had expired or staff removed it), and ``restored`` (a won
    dispute: given back to the lot, or first cancelling what was unrecovered)."""

    taken: Decimal
    unrecovered: Decimal
    restored: Decimal = ZERO
    lot: CreditLot | None = None


@dataclass(frozen=True)
class GoneBack:
    """A top-up's money gone back to the payer, each part from its own Stripe figure."""

    refunded: Decimal
    disputed: Decimal
    dispute_status: str

    def total(self, amount: Decimal) -> Decimal:
        return min(amount, self.refunded + self.disputed)


def gone_back(
    row: TopUp, *, refunded: object = None, dispute: tuple[str, object] | None = None
) -> GoneBack:
    """The top-up's money gone back once this event counts: ``refunded`` is the charge's
    cumulative refunded amount (an older, smaller figure changes nothing); ``dispute`` is the
    dispute's new status (``open``, ``won``, ``lost``) and amount. A won dispute stays won."""
    total = row.refunded
    if refunded is not None:
        total = max(total, min(validation.money("refunded", refunded), row.amount))
    disputed, status = row.disputed, row.dispute_status
    if dispute is not None and status != DisputeStatus.WON:
        status, amount = dispute
        if status not in (DisputeStatus.OPEN, DisputeStatus.WON, DisputeStatus.LOST):
            raise InvalidUsage(
                f"dispute status must be open, won or lost, got {status!r}.", field="dispute"
            )
        value = min(validation.money("disputed", amount), row.amount)
        disputed = ZERO if status == DisputeStatus.WON else value
    return GoneBack(total, disputed, status)


def take_back_plan(row: TopUp, lot: CreditLot | None, gone: GoneBack) -> tuple[Decimal, Decimal]:
    """What ``gone`` does to the lot: (its new live part, its new ``taken_back``). Pure, so that
    the Stripe grant can follow before the ledger changes (billing/topups.py)."""
    live, taken_back = (lot.amount - lot.forfeited, lot.taken_back) if lot else (ZERO, ZERO)
    delta = gone.total(row.amount) - GoneBack(row.refunded, row.disputed, "").total(row.amount)
    if delta > 0:
        take = min(delta, live)
        return live - take, taken_back + take
    give = max(ZERO, -delta - row.unrecovered)  # what was unrecovered is recovered first
    restored = min(give, taken_back)
    if lot is not None and lot.expired_at is not None:
        return live, taken_back - restored  # given back to expired credit: stays forfeited
    return live + restored, taken_back - restored


def top_up_take_back(
    *,
    top_up: TopUp,
    refunded: object = None,
    dispute: tuple[str, object] | None = None,
    mirror: GrantMirror | None = None,
    actor: str,
    reason: str,
    now: datetime | None = None,
) -> TakeBack:
    """Record money of a credited top-up gone back to the payer (a refund: the cumulative
    ``refunded``; a dispute: ``(status, amount)``) and lower its lot by the new part, spent or
    held or not: the limit may fall below spent + held, and spent credit taken back is debt the
    next credit pays. What the lot no longer has is ``unrecovered``. A won dispute gives its
    amount back (what was unrecovered first). A repeated event changes nothing. ``mirror``
    (:class:`GrantMirror`) is the lot's Stripe grant after this, saved with it. Audited."""
    now = now or timezone.now()
    with ledger_transaction():
        # The top-up's row first, as crediting takes it (billing/topups.py), then the balance.
        row = TopUp.objects.select_for_update().get(pk=top_up.pk)
        account = CreditAccount.objects.select_related("budget").get(pk=top_up.account_id)
        gone = gone_back(row, refunded=refunded, dispute=dispute)
        if (row.refunded, row.disputed, row.dispute_status) == (
            gone.refunded,
            gone.disputed,
            gone.dispute_status,
        ):
            # A redelivered or older event: the ledger has it; a grant put in step is recorded.
            if mirror is not None:
                _lock(account)
                lot = CreditLot.objects.select_for_update().filter(top_up=row).first()
                if lot is not None:
                    lot.save(update_fields=mirror_fields(lot, mirror))
            return TakeBack(ZERO, ZERO)
        locked, counter = _lock(account)
        lot = CreditLot.objects.select_for_update().filter(top_up=row).first()
        before_total = GoneBack(row.refunded, row.disputed, "").total(row.amount)
        delta = gone.total(row.amount) - before_total
        live, taken_back = take_back_plan(row, lot, gone)
        taken = restored = unrecovered = ZERO
        if delta > 0:
            taken = (lot.amount - lot.forfeited - live) if lot else ZERO
            unrecovered = delta - taken
            row.unrecovered += unrecovered
        elif delta < 0:
            recovered = min(-delta, row.unrecovered)
            row.unrecovered -= recovered
            restored = recovered + (lot.taken_back - taken_back if lot else ZERO)
        if lot is not None:
            lot.forfeited = lot.amount - live
            lot.taken_back = taken_back
            fields = ["forfeited", "taken_back"]
            if mirror is not None:
                fields += mirror_fields(lot, mirror)
            lot.save(update_fields=fields)
        row.refunded, row.disputed, row.dispute_status = (
            gone.refunded,
            gone.disputed,
            gone.dispute_status,
        )
        row.save(update_fields=["refunded", "disputed", "dispute_status", "unrecovered"])
        before = locked.budget.limit
        after = _sync_limit(locked)
        AuditEvent.objects.create(
            action="credits.take_back",
            actor=actor,
            tenant=locked.tenant,
            target=f"top-up {row.pk} of {locked.tenant.external_id}",
            before={"credit": str(before), "gone_back": str(before_total)},
            after={
                "credit": str(after),
                "refunded": str(gone.refunded),
                "disputed": str(gone.disputed),
                "dispute_status": gone.dispute_status,
                "taken": str(taken),
                "unrecovered": str(unrecovered),
                "restored": str(restored),
                "debt": str(max(ZERO, counter.spent - after)),
            },
            reason=reason,
        )
    return TakeBack(taken, unrecovered, restored, lot)


@dataclass(frozen=True)
class GrantMirror:
    """A lot's Stripe side (billing/topups.py makes it): its live grant (``""``: none) of
    ``granted``, what Stripe ``applied`` from its voided grants, and the replacement count."""

    grant_id: str
    granted: Decimal
    applied: Decimal
    generation: int


def mirror_fields(lot: CreditLot, mirror: GrantMirror) -> list[str]:
    """Set the lot's Stripe mirror; the fields to save."""
    lot.stripe_grant_id = mirror.grant_id
    lot.stripe_granted = mirror.granted
    lot.stripe_applied = mirror.applied
    lot.stripe_generation = mirror.generation
    return ["stripe_grant_id", "stripe_granted", "stripe_applied", "stripe_generation"]


def lot_mirror_save(*, lot_id: int, generation: int, mirror: GrantMirror) -> bool:
    """Save a lot's new Stripe mirror, made from the lot as it was at ``generation``: under the
    balance's locks, and only if no other writer replaced its grant since (False then: the caller
    reads the lot again)."""
    lot = CreditLot.objects.select_related("account__budget").get(pk=lot_id)
    with ledger_transaction():
        _lock(lot.account)
        locked = CreditLot.objects.select_for_update().get(pk=lot_id)
        if locked.stripe_generation != generation:
            return False
        locked.save(update_fields=mirror_fields(locked, mirror))
    return True


@ledger_guard("prepaid credit")
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
    with ledger_transaction():
        locked, counter = _lock(account)
        room = locked.budget.limit - counter.spent - counter.reserved
        if value > room:
            raise InvalidUsage(
                f"Cannot remove {display(value)} {locked.currency}: only {display(max(ZERO, room))}"
                " is neither spent nor held. Remove at most that.",
                field="amount",
            )
        _forfeit_last_used(locked, value)
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
