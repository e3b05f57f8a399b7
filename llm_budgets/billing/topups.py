"""Top-ups through Stripe: a Checkout session for an amount or a package, the webhooks that credit
the balance once per payment with the matching Stripe credit grant, refunds and disputes, staff
grants mirrored to Stripe.

Money going back (``charge.refunded``, ``charge.dispute.created`` / ``.closed``): the lot's new
live part is worked out first (``credits.take_back_plan``), the Stripe grant follows it
(:func:`grant_follow`: the grant is voided and a replacement issued for what Stripe has not
applied yet of the new live part, Idempotency-Key ``llmb-grant-lot-<lot>-r<n>-<cents>``), then
the ledger takes it back with the new grant recorded. If Stripe fails, the ledger takes it back
all the same and the daily job (:func:`grants_follow`) brings the grant into step later.

Exactly once: a top-up is one ``TopUp`` row; both ``checkout.session.completed`` (paid) and
``payment_intent.succeeded`` name it (metadata ``llmb_top_up``), and whichever is processed first
credits it under the row's lock; the other finds it credited. The credit grant is created before
the balance is raised, with the Idempotency-Key ``llmb-grant-topup-<id>``: if anything after it
fails, the webhook's transaction rolls back, Stripe redelivers, and the same key returns the same
grant. The grant call is made holding only the top-up's row, never the balance's counter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from llm_budgets import validation
from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.credits import (
    GrantMirror,
    account_of,
    credit_add,
    credit_deposit,
    from_minor_units,
    gone_back,
    lot_mirror_save,
    minor_units,
    take_back_plan,
    top_up_take_back,
)
from llm_budgets.billing.totals import unpaid_invoices
from llm_budgets.conf import conf
from llm_budgets.control.killswitches import kill_switch_clear
from llm_budgets.db.boundary import ledger_guard, ledger_transaction
from llm_budgets.exceptions import InvalidUsage, NotLinked, PaymentProviderError
from llm_budgets.models import (
    CreditAccount,
    CreditLot,
    DisputeStatus,
    LotKind,
    LotSource,
    StripeCustomerLink,
    StripeWebhookEvent,
    TopUp,
    TopUpKind,
    TopUpState,
)
from llm_budgets.money import ZERO, currency_places, display
from llm_budgets.money import money as money_text

ACTOR = "stripe webhook"
METADATA_KEY = "llmb_top_up"
# Stripe applies grants of a higher priority (lower number) first: promotional credit before
# paid, as the local order of use does (billing/credits.py).
PRIORITY = {LotKind.PROMOTIONAL: 10, LotKind.PAID: 50}


def customer_of(account: CreditAccount) -> str:
    link = StripeCustomerLink.objects.filter(
        tenant_id=account.tenant_id, unlinked_at__isnull=True
    ).first()
    if link is None:
        raise NotLinked(
            f"Tenant {account.tenant.external_id} is not linked to a Stripe customer: link it "
            "(link_stripe_customer) before taking or granting credit through Stripe.",
            field="tenant",
        )
    return link.customer_id


def packages() -> dict[str, Decimal]:
    """The operator's top-up packages (``LLM_BUDGETS["PREPAID_PACKAGES"]``: name -> amount)."""
    return conf.PREPAID_PACKAGES


@dataclass(frozen=True)
class CheckoutStarted:
    top_up: TopUp
    session_id: str
    url: str


@ledger_guard("top-up checkout")
def top_up_checkout(
    *,
    tenant: str,
    success_url: str,
    cancel_url: str,
    amount: object = None,
    package: str | None = None,
    actor: str = "",
    now: datetime | None = None,
) -> CheckoutStarted:
    """A Stripe Checkout session that pays ``amount`` (or the operator's ``package``) into the
    tenant's balance; redirect the tenant to ``url``. Credited by the webhook once paid. The
    payment method is saved for auto-recharge (``setup_future_usage=off_session``)."""
    now = now or timezone.now()
    account = account_of(tenant)
    customer = customer_of(account)
    if (amount is None) == (package is None):
        raise InvalidUsage("Give either amount or package, not both.", field="amount")
    if package is not None:
        offered = packages()
        if package not in offered:
            raise InvalidUsage(
                f"Unknown package {package!r}; the packages are: "
                f"{', '.join(sorted(offered)) or 'none (PREPAID_PACKAGES is empty)'}.",
                field="package",
            )
        value = offered[package]
    else:
        value = validation.money("amount", amount, places=currency_places(account.currency))
        most = conf.PREPAID_TOP_UP_MAX
        if most is not None and value > most:
            raise InvalidUsage(
                f"amount {money_text(value, account.currency)} is more than one top-up may pay, "
                f"{money_text(most, account.currency)} (LLM_BUDGETS['PREPAID_TOP_UP_MAX']): "
                "top up in several payments, or ask the operators.",
                field="amount",
            )
    if value <= 0:
        raise InvalidUsage("amount must be more than 0.", field="amount")
    for field, url in (("success_url", success_url), ("cancel_url", cancel_url)):
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidUsage(f"{field} must be an absolute http(s) URL.", field=field)
    cents = minor_units(value, account.currency)
    row = TopUp.objects.create(
        account=account,
        kind=TopUpKind.CHECKOUT,
        amount=value,
        currency=account.currency,
        package=package or "",
        created_at=now,
    )
    metadata = {METADATA_KEY: str(row.pk), "llmb_tenant": account.tenant.external_id}
    import stripe

    try:
        session = stripe_client().v1.checkout.sessions.create(
            params={
                "mode": "payment",
                "customer": customer,
                "client_reference_id": account.tenant.external_id,
                "metadata": metadata,
                "line_items": [
                    {
                        "quantity": 1,
                        "price_data": {
                            "currency": account.currency.lower(),
                            "unit_amount": cents,
                            "product_data": {"name": f"Credit top-up ({package or 'amount'})"},
                        },
                    }
                ],
                "payment_intent_data": {"setup_future_usage": "off_session", "metadata": metadata},
                "success_url": success_url,
                "cancel_url": cancel_url,
            },
            options={"idempotency_key": f"llmb-checkout-{row.pk}"},
        )
    except stripe.StripeError as exc:
        TopUp.objects.filter(pk=row.pk).update(state=TopUpState.FAILED, error=str(exc)[:1000])
        raise PaymentProviderError(
            f"Stripe did not create the Checkout session: {exc}. Nothing was charged; try again "
            "in a few seconds (Stripe's failure, not the request's)."
        ) from None
    TopUp.objects.filter(pk=row.pk).update(checkout_session_id=session.id)
    row.checkout_session_id = session.id
    return CheckoutStarted(top_up=row, session_id=session.id, url=str(session.url or ""))


def grant_params(
    account: CreditAccount, customer: str, amount: Decimal, kind: str, **extra: Any
) -> dict[str, Any]:
    """The credit grant matching a lot: same amount, category and order of use."""
    params: dict[str, Any] = {
        "customer": customer,
        "category": kind,
        "priority": PRIORITY[LotKind(kind)],
        "amount": {
            "type": "monetary",
            "monetary": {
                "currency": account.currency.lower(),
                "value": minor_units(amount, account.currency),
            },
        },
        "applicability_config": {"scope": {"price_type": "metered"}},
    }
    params.update(extra)
    return params


def _grant(params: dict[str, Any], key: str) -> str:
    """Create a credit grant (idempotent by ``key``); its id."""
    import stripe

    try:
        grant = stripe_client().v1.billing.credit_grants.create(
            params=params,  # type: ignore[arg-type]
            options={"idempotency_key": key},
        )
    except stripe.StripeError as exc:
        raise PaymentProviderError(
            f"Stripe did not create the credit grant: {exc}. The balance was not changed; try "
            "again in a few seconds (Stripe's failure, not the request's)."
        ) from None
    return str(grant.id)


@ledger_guard("prepaid credit")
def credit_grant(
    *,
    tenant: str,
    amount: object,
    kind: str = LotKind.PROMOTIONAL,
    expires_at: datetime | None = None,
    actor: str,
    reason: str,
    now: datetime | None = None,
) -> CreditLot:
    """Staff grant (a free trial, goodwill): a lot, and for a linked tenant the Stripe credit
    grant that makes the next usage invoice draw on it (same expiry). Audited."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidUsage("A grant needs a reason.", field="reason")
    account = account_of(tenant)
    link = StripeCustomerLink.objects.filter(
        tenant_id=account.tenant_id, unlinked_at__isnull=True
    ).first()
    with ledger_transaction():
        lot = credit_add(
            account=account,
            amount=amount,
            kind=kind,
            source=LotSource.GRANT,
            expires_at=expires_at,
            actor=actor,
            reason=reason,
            now=now,
        )
        if link is not None:
            extra: dict[str, Any] = {
                "name": f"Grant {lot.pk}: {reason}"[:100],
                "metadata": {"llmb_lot": str(lot.pk)},
            }
            if expires_at is not None:
                extra["expires_at"] = int(expires_at.timestamp())
            params = grant_params(account, link.customer_id, lot.amount, kind, **extra)
            lot.stripe_grant_id = _grant(params, f"llmb-grant-lot-{lot.pk}")
            lot.stripe_granted = lot.amount
            lot.save(update_fields=["stripe_grant_id", "stripe_granted"])
    return lot


def _metadata_top_up(obj: dict[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get(METADATA_KEY)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def top_up_credit(
    *,
    top_up_id: int,
    payment_intent: str | None,
    paid_minor: object,
    currency: object,
    customer: object,
    event_id: str,
    now: datetime,
) -> str:
    """Credit a paid top-up once: the Stripe grant, then the balance. What happened, in words."""
    row = (
        TopUp.objects.select_for_update(of=("self",))
        .select_related("account__tenant", "account__budget")
        .filter(pk=top_up_id)
        .first()
    )
    if row is None:
        return f"top-up {top_up_id} unknown: ignored"
    if row.state == TopUpState.CREDITED:
        return f"top-up {row.pk} already credited (event {row.credited_by_event})"
    account = row.account
    expected = customer_of(account)
    if customer != expected:
        raise ValueError(
            f"Top-up {row.pk} belongs to customer {expected}, but the payment is {customer!r}: "
            "not credited."
        )
    if not isinstance(paid_minor, int) or str(currency).upper() != row.currency:
        raise ValueError(f"Top-up {row.pk}: the payment has no amount in {row.currency}.")
    if from_minor_units(paid_minor, row.currency) != row.amount:
        raise ValueError(
            f"Top-up {row.pk} is {display(row.amount)} {row.currency} but "
            f"{display(from_minor_units(paid_minor, row.currency))} was paid: not credited."
        )
    grant_id = _grant(
        grant_params(
            account,
            expected,
            row.amount,
            LotKind.PAID,
            name=f"Top-up {row.pk}",
            metadata={METADATA_KEY: str(row.pk)},
        ),
        f"llmb-grant-topup-{row.pk}",
    )
    deposit = credit_deposit(
        account=account,
        amount=row.amount,
        kind=LotKind.PAID,
        source=LotSource.RECHARGE if row.kind == TopUpKind.RECHARGE else LotSource.TOP_UP,
        top_up=row,
        actor=ACTOR,
        reason=f"Stripe payment {payment_intent} (event {event_id})",
        now=now,
    )
    lot = deposit.lot
    lot.stripe_grant_id, lot.stripe_granted = grant_id, row.amount
    lot.save(update_fields=["stripe_grant_id", "stripe_granted"])
    row.state = TopUpState.CREDITED
    row.payment_intent_id = payment_intent
    row.credited_by_event = event_id
    row.credited_at = now
    row.save(update_fields=["state", "payment_intent_id", "credited_by_event", "credited_at"])
    cleared = _clear_recharge_switch(account, row, now)
    debt = (
        f"; {display(deposit.debt_paid)} of it paid the balance's debt first"
        if deposit.debt_paid
        else ""
    )
    return (
        f"credited top-up {row.pk}: {display(row.amount)} {row.currency} (grant {grant_id})"
        + debt
        + cleared
    )


def _clear_recharge_switch(account: CreditAccount, row: TopUp, now: datetime) -> str:
    """A payment came through: the payment switch a failed recharge tripped clears, unless an
    invoice it also waits on is still unpaid (billing/webhooks.py clears those)."""
    link = (
        StripeCustomerLink.objects.select_for_update(of=("self",))
        .filter(tenant_id=account.tenant_id, unlinked_at__isnull=True)
        .select_related("payment_switch")
        .first()
    )
    switch = link.payment_switch if link else None
    if link is None or switch is None or switch.cleared_at is not None:
        return ""
    if unpaid_invoices(account.tenant_id):
        return f"; kill switch {switch.pk} still waits on unpaid invoices"
    link.payment_switch = None
    link.save(update_fields=["payment_switch"])
    kill_switch_clear(
        switch_id=switch.pk,
        reason=f"top-up {row.pk} paid: the balance can be recharged again",
        actor=ACTOR,
        now=now,
    )
    return f"; cleared kill switch {switch.pk}"


def _object(event: dict[str, Any]) -> dict[str, Any]:
    return dict((event.get("data") or {}).get("object") or {})


def checkout_completed(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    session = _object(event)
    top_up = _metadata_top_up(session)
    if top_up is None:
        return "not a top-up: ignored"
    if session.get("payment_status") != "paid":
        return f"top-up {top_up}: not paid yet; credited at payment_intent.succeeded"
    return top_up_credit(
        top_up_id=top_up,
        payment_intent=session.get("payment_intent"),
        paid_minor=session.get("amount_total"),
        currency=session.get("currency"),
        customer=session.get("customer"),
        event_id=event["id"],
        now=now,
    )


def payment_succeeded(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    intent = _object(event)
    top_up = _metadata_top_up(intent)
    if top_up is None:
        return "not a top-up: ignored"
    outcome = top_up_credit(
        top_up_id=top_up,
        payment_intent=intent.get("id"),
        paid_minor=intent.get("amount_received"),
        currency=intent.get("currency"),
        customer=intent.get("customer"),
        event_id=event["id"],
        now=now,
    )
    method = intent.get("payment_method")
    if isinstance(method, str) and method:
        # The card saved at checkout is what auto-recharge charges off-session.
        CreditAccount.objects.filter(top_ups__pk=top_up).update(payment_method_id=method)
    return outcome


def _applied(client: Any, grant_id: str, currency: str) -> Decimal:
    """What Stripe applied to invoices from a grant: its credit balance transactions (debits
    ``credits_applied``, less credits reinstated by a voided invoice). Read from the
    transactions, not the grant's balance, so it is the same before and after a void."""
    minor = 0
    for item in client.v1.billing.credit_balance_transactions.list(
        params={"credit_grant": grant_id, "limit": 100}
    ).auto_paging_iter():
        data = item.to_dict()
        debit, credit = data.get("debit") or {}, data.get("credit") or {}
        if data.get("type") == "debit" and debit.get("type") == "credits_applied":
            minor += debit["amount"]["monetary"]["value"]
        elif data.get("type") == "credit" and credit.get("type") == (
            "credits_application_invoice_voided"
        ):
            minor -= credit["amount"]["monetary"]["value"]
    return from_minor_units(minor, currency)


def _void(client: Any, grant_id: str) -> None:
    """Void a grant unless it is voided already (a retry after a void whose answer was lost)."""
    import stripe

    try:
        grant = client.v1.billing.credit_grants.retrieve(grant_id)
        if grant.to_dict().get("voided_at") is None:
            client.v1.billing.credit_grants.void_grant(grant_id)
    except stripe.StripeError as exc:
        raise PaymentProviderError(f"Stripe did not void credit grant {grant_id}: {exc}.") from None


def mirrored(lot: CreditLot) -> bool:
    """Whether the lot has (or had) a Stripe grant."""
    return bool(lot.stripe_grant_id) or lot.stripe_generation > 0


def grant_follow(lot: CreditLot, live: Decimal) -> GrantMirror | None:
    """Bring the lot's Stripe grant to a live part of ``live``: when it is not in step, void the
    grant and issue a replacement for ``live`` less what Stripe applied from this lot's grants
    (none when nothing is left), so Stripe never applies credit the ledger took back. Idempotent
    (the replacement's key names the lot, the replacement count and the amount). The mirror to
    save, or None when in step or never mirrored (a lot of an unlinked tenant, an adjustment)."""
    if not mirrored(lot) or lot.expired_at is not None:
        return None  # Stripe expires an expired lot's grant itself
    if live == lot.stripe_applied + lot.stripe_granted and bool(lot.stripe_grant_id) == (
        lot.stripe_granted > 0
    ):
        return None
    account = CreditAccount.objects.select_related("tenant").get(pk=lot.account_id)
    customer = customer_of(account)
    client = stripe_client()
    applied = lot.stripe_applied
    if lot.stripe_grant_id:
        import stripe

        try:
            applied += _applied(client, lot.stripe_grant_id, account.currency)
        except stripe.StripeError as exc:
            raise PaymentProviderError(
                f"Stripe did not list credit grant {lot.stripe_grant_id}'s transactions: {exc}."
            ) from None
        _void(client, lot.stripe_grant_id)
    remainder = max(ZERO, live - applied)
    generation = lot.stripe_generation + 1
    grant_id = ""
    if remainder > 0:
        metadata = {"llmb_lot": str(lot.pk), "llmb_replaces": lot.stripe_grant_id or "-"}
        if lot.top_up_id:
            metadata[METADATA_KEY] = str(lot.top_up_id)
        extra: dict[str, Any] = {"name": f"Lot {lot.pk}, replacement {generation}"}
        if lot.expires_at is not None:
            extra["expires_at"] = int(lot.expires_at.timestamp())
        cents = minor_units(remainder, account.currency)
        grant_id = _grant(
            grant_params(account, customer, remainder, lot.kind, metadata=metadata, **extra),
            f"llmb-grant-lot-{lot.pk}-r{generation}-{cents}",
        )
    return GrantMirror(grant_id, remainder, applied, generation)


def grants_follow() -> int:
    """Bring every mirrored lot's Stripe grant into step with its live part (after an expiry,
    a staff removal, a take-back whose Stripe call failed). Returns how many were replaced;
    a lot Stripe fails on is left for the next run (the reconciliation shows it)."""
    moved = 0
    lots = CreditLot.objects.filter(expired_at__isnull=True).exclude(
        stripe_grant_id="", stripe_generation=0
    )
    for lot in lots:
        for _ in range(2):  # again, once, if a take-back replaced the grant meanwhile
            try:
                mirror = grant_follow(lot, lot.amount - lot.forfeited)
            except (PaymentProviderError, NotLinked):
                break
            if mirror is None:
                break
            if lot_mirror_save(lot_id=lot.pk, generation=lot.stripe_generation, mirror=mirror):
                moved += 1
                break
            lot.refresh_from_db()
    return moved


def _taken_back(
    intent: object,
    event: dict[str, Any],
    what: str,
    *,
    refunded: object = None,
    dispute: tuple[str, object] | None = None,
) -> str:
    row = (
        TopUp.objects.select_for_update(of=("self",)).filter(payment_intent_id=intent).first()
        if intent
        else None
    )
    if row is None:
        return f"{what} of no credited top-up: ignored"
    lot = CreditLot.objects.filter(top_up=row).first()
    mirror, stripe_note = None, ""
    if lot is not None:
        live, _ = take_back_plan(row, lot, gone_back(row, refunded=refunded, dispute=dispute))
        try:
            mirror = grant_follow(lot, live)
        except (PaymentProviderError, NotLinked) as exc:
            stripe_note = f"; grant not in step yet ({exc}): the daily job retries"
    result = top_up_take_back(
        top_up=row,
        refunded=refunded,
        dispute=dispute,
        mirror=mirror,
        actor=ACTOR,
        reason=f"Stripe {what} (event {event['id']})",
    )
    grant = f"; grant replaced by {mirror.grant_id or 'none'}" if mirror else stripe_note
    return (
        f"{what} of top-up {row.pk}: took back {display(result.taken)}, unrecovered "
        f"{display(result.unrecovered)}, restored {display(result.restored)} {row.currency}" + grant
    )


def _minor(obj: dict[str, Any], key: str, what: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"The {what} has no {key}.")
    return value


def _top_up_of(obj: dict[str, Any]) -> TopUp | None:
    intent = obj.get("payment_intent")
    return TopUp.objects.filter(payment_intent_id=intent).first() if intent else None


def charge_refunded(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    charge = _object(event)
    top_up = _top_up_of(charge)
    if top_up is None:
        return "refund of no credited top-up: ignored"
    minor = _minor(charge, "amount_refunded", "refund")
    return _taken_back(
        charge.get("payment_intent"),
        event,
        "refund",
        refunded=from_minor_units(minor, top_up.currency),
    )


# A dispute's status as Stripe closes it, and what it means for the money.
_CLOSED = {
    "won": DisputeStatus.WON,
    "warning_closed": DisputeStatus.WON,
    "lost": DisputeStatus.LOST,
}


def _dispute(event: dict[str, Any], status: str) -> str:
    dispute = _object(event)
    top_up = _top_up_of(dispute)
    if top_up is None:
        return "dispute of no credited top-up: ignored"
    minor = _minor(dispute, "amount", "dispute")
    return _taken_back(
        dispute.get("payment_intent"),
        event,
        f"dispute ({status})",
        dispute=(status, from_minor_units(minor, top_up.currency)),
    )


def dispute_created(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    return _dispute(event, DisputeStatus.OPEN)


def dispute_closed(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    status = _CLOSED.get(str(_object(event).get("status")))
    if status is None:
        return f"dispute closed as {_object(event).get('status')!r}: nothing to change"
    return _dispute(event, status)


HANDLERS = {
    "checkout.session.completed": checkout_completed,
    "checkout.session.async_payment_succeeded": checkout_completed,
    "payment_intent.succeeded": payment_succeeded,
    "charge.refunded": charge_refunded,
    "charge.dispute.created": dispute_created,
    "charge.dispute.closed": dispute_closed,
}
