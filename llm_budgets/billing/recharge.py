"""Auto-recharge payments: the job that pays each pending recharge row (written by the commit
that crossed the threshold, ``billing/balances.py``) off-session with the saved card.

Each row is claimed under its lock (``skip_locked``: two workers never pay the same row), then
paid with ``PaymentIntent.create(confirm=True, off_session=True)`` and the Idempotency-Key
``llmb-recharge-<id>``, so a retry after a lost answer cannot charge twice. A success is credited
at once (``topups.top_up_credit``; the ``payment_intent.succeeded`` webhook then finds it
credited). Beyond the account's daily maximum the row is skipped. A decline or a card that needs
the customer fails the row: an alert (``payment.failed``, action ``recharge_failed``) and, with
``STRIPE_ON_PAYMENT_FAILED="trip"``, the tenant's payment kill switch; the balance is not armed
again until a top-up lifts it back above the threshold.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from llm_budgets.alerts.emit import alert_emit
from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.credits import minor_units
from llm_budgets.billing.topups import METADATA_KEY, customer_of, top_up_credit
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.control.killswitches import (
    PAYMENT_FAILED_DETECTOR,
    kill_switch_trip,
    switch_scope,
)
from llm_budgets.db.boundary import ledger_transaction
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import StripeCustomerLink, TopUp, TopUpKind, TopUpState
from llm_budgets.money import ZERO, display

ACTOR = "auto-recharge"
# Transient failures (connection, 5xx, 429) are retried by the next run with the same key, at
# most this many times; then the row fails like a decline.
MAX_ATTEMPTS = 5


def recharges_send(*, now: datetime | None = None) -> dict[str, int]:
    """Pay every pending recharge. Returns counts by outcome (all 0 without ``STRIPE_API_KEY``:
    the recharges wait)."""
    now = now or timezone.now()
    counts = {"credited": 0, "failed": 0, "skipped": 0, "retry": 0}
    if not conf.STRIPE_API_KEY:
        return counts
    pending = TopUp.objects.filter(kind=TopUpKind.RECHARGE, state=TopUpState.PENDING)
    for pk in list(pending.order_by("created_at").values_list("pk", flat=True)):
        outcome = recharge_pay(pk, now=now)
        if outcome in counts:
            counts[outcome] += 1
    return counts


def recharge_pay(top_up_id: int, *, now: datetime) -> str:
    """Pay one pending recharge (claimed under its row lock); what became of it."""
    import stripe

    with ledger_transaction():
        row = (
            TopUp.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("account__tenant")
            .filter(pk=top_up_id, state=TopUpState.PENDING)
            .first()
        )
        if row is None:
            return "taken"  # another worker has it, or it is done
        account = row.account
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        today = (
            TopUp.objects.filter(
                account=account,
                kind=TopUpKind.RECHARGE,
                state=TopUpState.CREDITED,
                credited_at__gte=day,
                credited_at__lt=day + timedelta(days=1),
            ).aggregate(total=Sum("amount"))["total"]
            or ZERO
        )
        cap = account.recharge_daily_max or row.amount
        if Decimal(today) + row.amount > cap:
            row.state = TopUpState.SKIPPED
            row.error = (
                f"daily maximum {display(cap)} {row.currency} reached ({display(today)} today)"
            )
            row.save(update_fields=["state", "error"])
            _failed(row, "recharge_skipped", now)
            return "skipped"
        try:
            customer = customer_of(account)
            if not account.payment_method_id:
                raise ValueError("no saved payment method: the tenant must top up once by Checkout")
            intent = stripe_client().v1.payment_intents.create(
                params={
                    "amount": minor_units(row.amount, row.currency),
                    "currency": row.currency.lower(),
                    "customer": customer,
                    "payment_method": account.payment_method_id,
                    "off_session": True,
                    "confirm": True,
                    "metadata": {
                        METADATA_KEY: str(row.pk),
                        "llmb_tenant": account.tenant.external_id,
                    },
                },
                options={"idempotency_key": f"llmb-recharge-{row.pk}"},
            )
        except (stripe.APIConnectionError, stripe.RateLimitError, stripe.APIError) as exc:
            row.attempts += 1
            row.error = str(exc)[:1000]
            if row.attempts < MAX_ATTEMPTS:
                row.save(update_fields=["attempts", "error"])
                return "retry"
            row.state = TopUpState.FAILED
            row.save(update_fields=["attempts", "error", "state"])
            _failed(row, "recharge_failed", now)
            return "failed"
        except (stripe.StripeError, ValueError, InvalidUsage) as exc:
            row.attempts += 1
            row.state = TopUpState.FAILED
            row.error = str(getattr(exc, "user_message", None) or exc)[:1000]
            row.save(update_fields=["attempts", "error", "state"])
            _failed(row, "recharge_failed", now)
            return "failed"
        top_up_credit(
            top_up_id=row.pk,
            payment_intent=str(intent.id),
            paid_minor=intent.amount_received,
            currency=intent.currency,
            customer=intent.customer,
            event_id=f"recharge {row.pk}",
            now=now,
        )
    return "credited"


def _failed(row: TopUp, action: str, now: datetime) -> None:
    """Tell the operator (and, with ``STRIPE_ON_PAYMENT_FAILED="trip"``, stop the tenant)."""
    tenant = row.account.tenant
    alert_emit(
        "payment.failed",
        tenant=tenant,
        body={
            "tenant": tenant.external_id,
            "invoice_id": f"recharge {row.pk}",
            "stripe_event_id": "",
            "action": action,
            "failed_at": time_field(now),
        },
        dedupe_key=f"payment.failed:recharge:{row.pk}",
        now=now,
    )
    if action != "recharge_failed" or conf.STRIPE_ON_PAYMENT_FAILED != "trip":
        return
    link = (
        StripeCustomerLink.objects.select_for_update()
        .filter(tenant=tenant, unlinked_at__isnull=True)
        .first()
    )
    scope = switch_scope(tenant=tenant.external_id)
    assert scope is not None
    switch = kill_switch_trip(
        scope=scope,
        reason=(
            f"auto-recharge {row.pk} of {display(row.amount)} {row.currency} failed: {row.error}"
        )[:255],
        actor=ACTOR,
        automatic=True,
        detector=PAYMENT_FAILED_DETECTOR,
        now=now,
    )
    if (
        link is not None
        and switch.detector == PAYMENT_FAILED_DETECTOR
        and link.payment_switch is None
    ):
        link.payment_switch = switch
        link.save(update_fields=["payment_switch"])
