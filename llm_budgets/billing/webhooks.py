"""Stripe webhooks: verify, store raw, process once, in a transaction.

The view (:mod:`llm_budgets.billing.views`) refuses a request whose signature does not verify
before anything is stored. :func:`webhook_receive` stores the event by its id (Stripe retries a
delivery until it gets a 2xx, so the same id may arrive many times), processes it once in a
transaction, and on failure stores the error and raises, so the view answers 500 and Stripe
retries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from llm_budgets.billing.links import stripe_customer_unlink
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.killswitches import kill_switch_clear, kill_switch_trip, switch_scope
from llm_budgets.models import (
    MeterDelivery,
    MeterErrorReport,
    StripeCustomerLink,
    StripeWebhookEvent,
)

logger = logging.getLogger(__name__)

ACTOR = "stripe webhook"
DETECTOR = "stripe_payment_failed"


class WebhookSignatureError(InvalidUsage):
    """The request is not signed by Stripe with the configured secret: nothing was stored."""


def webhook_verify(*, payload: bytes, signature: str | None) -> dict[str, Any]:
    """The event if ``payload`` is signed with ``STRIPE_WEBHOOK_SECRET`` (and fresh)."""
    import stripe

    secret = conf.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise WebhookSignatureError(
            "STRIPE_WEBHOOK_SECRET is not set, so no webhook can be verified.", field="secret"
        )
    if not signature:
        raise WebhookSignatureError("Missing Stripe-Signature header.", field="signature")
    try:
        stripe.WebhookSignature.verify_header(payload.decode(), signature, secret, 300)
        event = json.loads(payload)
    except (stripe.SignatureVerificationError, ValueError, UnicodeDecodeError) as exc:
        raise WebhookSignatureError(
            f"Invalid signature or payload: {exc}", field="signature"
        ) from None
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not event.get("type"):
        raise WebhookSignatureError("The payload is not a Stripe event.", field="payload")
    return event


def webhook_receive(
    *, payload: bytes, event: dict[str, Any], now: datetime | None = None
) -> StripeWebhookEvent:
    """Store ``event`` (verified) and process it once. Raises the processing error after storing
    it (the caller answers 5xx so Stripe retries)."""
    now = now or timezone.now()
    row, _ = StripeWebhookEvent.objects.get_or_create(
        id=event["id"],
        defaults={"type": event["type"], "payload": payload.decode(), "received_at": now},
    )
    if row.processed_at is not None:
        return row
    try:
        with transaction.atomic():
            locked = StripeWebhookEvent.objects.select_for_update().get(pk=row.pk)
            if locked.processed_at is not None:
                return locked
            handler = HANDLERS.get(event["type"])
            outcome = handler(event, locked, now) if handler else "ignored (type not handled)"
            locked.processed_at = now
            locked.outcome = outcome[:255]
            locked.attempts += 1
            locked.error = ""
            locked.save(update_fields=["processed_at", "outcome", "attempts", "error"])
            return locked
    except Exception as exc:
        StripeWebhookEvent.objects.filter(pk=row.pk).update(
            error=f"{type(exc).__name__}: {exc}", attempts=row.attempts + 1
        )
        logger.exception("Stripe webhook %s (%s) failed", event["id"], event["type"])
        raise


def _object(event: dict[str, Any]) -> dict[str, Any]:
    return dict((event.get("data") or {}).get("object") or {})


def _link(customer: object) -> StripeCustomerLink | None:
    if not isinstance(customer, str):
        return None
    return (
        StripeCustomerLink.objects.select_for_update()
        .filter(customer_id=customer, unlinked_at__isnull=True)
        .select_related("tenant")
        .first()
    )


def _payment_failed(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    invoice = _object(event)
    link = _link(invoice.get("customer"))
    if link is None:
        return "no linked tenant"
    if conf.STRIPE_ON_PAYMENT_FAILED != "trip":
        return "payment failed: ignored (STRIPE_ON_PAYMENT_FAILED='ignore')"
    if link.payment_switch_id is not None:
        return f"tenant already stopped by kill switch {link.payment_switch_id}"
    scope = switch_scope(tenant=link.tenant.external_id)
    assert scope is not None
    switch = kill_switch_trip(
        scope=scope,
        reason=f"Stripe invoice {invoice.get('id')} payment failed (event {event['id']})",
        actor=ACTOR,
        automatic=True,
        detector=DETECTOR,
        now=now,
    )
    if switch.detector != DETECTOR:
        return f"tenant already stopped by kill switch {switch.pk} (not ours: left alone)"
    link.payment_switch = switch
    link.payment_failed_invoice = str(invoice.get("id") or "")
    link.save(update_fields=["payment_switch", "payment_failed_invoice"])
    return f"tripped kill switch {switch.pk}"


def _paid(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    invoice = _object(event)
    link = _link(invoice.get("customer"))
    if link is None or link.payment_switch is None:
        return "nothing to clear"
    switch = link.payment_switch
    link.payment_switch = None
    link.payment_failed_invoice = ""
    link.save(update_fields=["payment_switch", "payment_failed_invoice"])
    if switch.cleared_at is not None:
        return f"kill switch {switch.pk} was already cleared"
    kill_switch_clear(
        switch_id=switch.pk,
        reason=f"Stripe invoice {invoice.get('id')} paid (event {event['id']})",
        actor=ACTOR,
        now=now,
    )
    return f"cleared kill switch {switch.pk}"


def _customer_deleted(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    link = _link(_object(event).get("id"))
    if link is None:
        return "no linked tenant"
    stripe_customer_unlink(
        tenant=link.tenant,
        reason=f"Stripe customer deleted (event {event['id']})",
        actor=ACTOR,
        now=now,
    )
    return f"unlinked tenant {link.tenant.external_id}"


def _meter_error(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    """Thin v2 event ``v1.billing.meter.error_report_triggered``: its ``data.reason`` lists error
    types with sample errors naming the failed events' identifiers. A thin notification without
    ``data`` is fetched from Stripe."""
    data = event.get("data")
    if not data:
        from llm_budgets.billing.client import stripe_client

        fetched = stripe_client().v2.core.events.retrieve(event["id"])
        data = fetched.to_dict().get("data") or {}
    recorded = 0
    for error_type in (data.get("reason") or {}).get("error_types") or []:
        code = str(error_type.get("code") or "")
        for sample in error_type.get("sample_errors") or []:
            identifier = str(((sample.get("request") or {}).get("identifier")) or "")
            MeterErrorReport.objects.create(
                delivery=MeterDelivery.objects.filter(identifier=identifier).first(),
                identifier=identifier,
                code=code,
                message=str(sample.get("error_message") or ""),
                webhook_event=row,
                created_at=now,
            )
            recorded += 1
    return f"recorded {recorded} meter error(s)"


HANDLERS: dict[str, Callable[[dict[str, Any], StripeWebhookEvent, datetime], str]] = {
    "invoice.payment_failed": _payment_failed,
    "invoice.paid": _paid,
    "customer.deleted": _customer_deleted,
    "v1.billing.meter.error_report_triggered": _meter_error,
    "v1.billing.meter.no_meter_found": _meter_error,
}
