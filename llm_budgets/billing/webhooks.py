"""Stripe webhooks: verify, store raw, process once, in a transaction.

The view (:mod:`llm_budgets.billing.views`) refuses a request whose signature does not verify
before anything is stored. :func:`webhook_receive` reads the event from the body
(:mod:`llm_budgets.billing.webhook_shapes`), stores it by its id with the body byte for byte
(Stripe retries a delivery until it gets a 2xx, so the same id may arrive many times), processes
it once in a transaction, and on failure stores the error and raises, so the view answers 500
and Stripe retries.

A signed event this app cannot read (a field of the wrong type, text no database stores, JSON
nested deeper than any Stripe event) is stored *unprocessable* with the reason naming the field,
before anything acts on it, and answered 200: Stripe would retry it for days and it would never
read better. Staff reprocess it from the admin (:func:`webhook_reprocess`) once a release reads
it. An event whose id cannot be stored is kept under the digest of its body.

The payment switch (``STRIPE_ON_PAYMENT_FAILED="trip"``): a failed invoice trips the tenant's
switch, and it clears only once every invoice whose failure it waits on is settled: paid or
voided (``StripeInvoice``). Stripe does not order deliveries, so a paid invoice is remembered and
its late failure trips nothing; "marked uncollectible" settles nothing (the debt stands, and a
person decides).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from llm_budgets.alerts.emit import alert_emit
from llm_budgets.billing import topups
from llm_budgets.billing.links import stripe_customer_unlink
from llm_budgets.billing.totals import unpaid_invoices
from llm_budgets.billing.webhook_shapes import (
    MAX_ID_LENGTH,
    WebhookPayloadError,
    event_identity,
    event_read,
)
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.control.killswitches import (
    PAYMENT_FAILED_DETECTOR,
    kill_switch_clear,
    kill_switch_trip,
    switch_scope,
)
from llm_budgets.db.ledger import on_ledger
from llm_budgets.exceptions import Fault, InvalidUsage
from llm_budgets.models import (
    AuditEvent,
    InvoiceSettlement,
    MeterDelivery,
    MeterErrorReport,
    StripeCustomerLink,
    StripeInvoice,
    StripeWebhookEvent,
    WebhookEventState,
)

logger = logging.getLogger(__name__)

ACTOR = "stripe webhook"
DETECTOR = PAYMENT_FAILED_DETECTOR
UNPROCESSABLE = "unprocessable"

__all__ = [
    "ACTOR",
    "HANDLERS",
    "WebhookPayloadError",
    "WebhookSignatureError",
    "error_text",
    "webhook_receive",
    "webhook_reprocess",
    "webhook_verify",
]


class WebhookSignatureError(InvalidUsage):
    """The request is not signed by Stripe with the configured secret: nothing was stored."""

    fault = Fault.CALLER  # the sender's (a forger, or a secret that does not match)


def webhook_verify(*, payload: bytes, signature: str | None) -> None:
    """Returns if ``payload`` is signed with ``STRIPE_WEBHOOK_SECRET`` and fresh; else
    ``WebhookSignatureError``. Says nothing of what the payload holds (:func:`webhook_receive`
    reads it)."""
    import stripe

    secret = conf.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise WebhookSignatureError(
            "STRIPE_WEBHOOK_SECRET is not set, so no webhook can be verified.", field="secret"
        )
    if not signature:
        raise WebhookSignatureError("Missing Stripe-Signature header.", field="signature")
    try:
        # Stripe signs the body's text: a body that is not UTF-8 cannot be verified.
        stripe.WebhookSignature.verify_header(payload.decode(), signature, secret, 300)
    except (stripe.SignatureVerificationError, ValueError, UnicodeDecodeError) as exc:
        raise WebhookSignatureError(
            f"Invalid signature or payload: {exc}", field="signature"
        ) from None


def error_text(exc: Exception) -> str:
    """What is stored and answered for a processing failure: a database's own message (which may
    quote SQL or values) stays in the log."""
    if isinstance(exc, DatabaseError):
        return f"{type(exc).__name__} (database error; details in the log)"
    return f"{type(exc).__name__}: {exc}"[:1000]


@on_ledger
def webhook_receive(*, payload: bytes, now: datetime | None = None) -> StripeWebhookEvent:
    """Store the event ``payload`` holds (verified: :func:`webhook_verify`) and process it once.
    An event this app cannot read is stored unprocessable, with the reason, and returned (the
    caller answers 200). Raises the processing error after storing it (the caller answers 5xx so
    Stripe retries)."""
    now = now or timezone.now()
    try:
        event = event_read(payload)
    except WebhookPayloadError as exc:
        return _unprocessable(payload, exc.message, now)
    row, _ = StripeWebhookEvent.objects.get_or_create(
        id=event["id"], defaults={"type": event["type"], "body": payload, "received_at": now}
    )
    if row.state != WebhookEventState.RECEIVED:
        return row  # processed, or unprocessable (a person reprocesses it): a redelivery
    return _process(row, event, now)


def _unprocessable(payload: bytes, reason: str, now: datetime) -> StripeWebhookEvent:
    """Store an event that cannot be read, by its id (or its body's digest, when the id cannot
    be stored: Stripe redelivers the same body), with the reason; nothing acts on it."""
    ident, kind = event_identity(payload)
    key = ident or f"sha256:{hashlib.sha256(payload).hexdigest()}"
    row, created = StripeWebhookEvent.objects.get_or_create(
        id=key,
        defaults={
            "type": kind,
            "body": payload,
            "received_at": now,
            "state": WebhookEventState.UNPROCESSABLE,
            "attempts": 1,
            "error": reason,
            "outcome": UNPROCESSABLE,
        },
    )
    if created:
        logger.warning("Stripe webhook %s unprocessable (stored, answered 200): %s", key, reason)
    elif row.state == WebhookEventState.RECEIVED:
        # An earlier delivery failed while processing; this release cannot read it at all.
        StripeWebhookEvent.objects.filter(pk=key, state=WebhookEventState.RECEIVED).update(
            state=WebhookEventState.UNPROCESSABLE, error=reason, outcome=UNPROCESSABLE
        )
        row.refresh_from_db()
    return row


def _process(row: StripeWebhookEvent, event: dict[str, Any], now: datetime) -> StripeWebhookEvent:
    """Run the event's handler once, in a transaction; store the failure and raise it."""
    try:
        with transaction.atomic():
            locked = StripeWebhookEvent.objects.select_for_update().get(pk=row.pk)
            if locked.state == WebhookEventState.PROCESSED:
                return locked
            handler = HANDLERS.get(event["type"])
            outcome = handler(event, locked, now) if handler else "ignored (type not handled)"
            locked.state = WebhookEventState.PROCESSED
            locked.processed_at = now
            locked.outcome = outcome[:255]
            locked.attempts += 1
            locked.error = ""
            locked.save(update_fields=["state", "processed_at", "outcome", "attempts", "error"])
            return locked
    except Exception as exc:
        StripeWebhookEvent.objects.filter(pk=row.pk).update(
            error=error_text(exc), attempts=row.attempts + 1
        )
        logger.exception("Stripe webhook %s (%s) failed", row.pk, row.type)
        raise


@on_ledger
def webhook_reprocess(
    *, event_id: str, actor: str, now: datetime | None = None
) -> StripeWebhookEvent:
    """A person runs a stored event again, read from its body as if just delivered (for an
    unprocessable event once a release reads it; for a failed one without waiting for Stripe's
    next retry). A processed event is left as it is. Audited; a failure is stored on the event,
    which keeps its state, and not raised."""
    now = now or timezone.now()
    row = StripeWebhookEvent.objects.get(pk=event_id)
    if row.state == WebhookEventState.PROCESSED:
        return row
    before = {"state": row.state, "error": row.error}
    try:
        event = event_read(bytes(row.body))
    except WebhookPayloadError as exc:
        StripeWebhookEvent.objects.filter(pk=row.pk).exclude(
            state=WebhookEventState.PROCESSED
        ).update(
            state=WebhookEventState.UNPROCESSABLE,
            error=exc.message,
            outcome=UNPROCESSABLE,
            attempts=row.attempts + 1,
        )
    else:
        with contextlib.suppress(Exception):  # stored on the row and logged by _process
            _process(row, event, now)
    row.refresh_from_db()
    AuditEvent.objects.create(
        action="stripe.webhook_reprocess",
        actor=actor,
        target=f"Stripe event {row.pk}"[:MAX_ID_LENGTH],
        before=before,
        after={"state": row.state, "outcome": row.outcome, "error": row.error},
        reason="reprocessed in the admin",
    )
    return row


def _object(event: dict[str, Any]) -> dict[str, Any]:
    return dict((event.get("data") or {}).get("object") or {})


def _link(customer: str) -> StripeCustomerLink | None:
    return (
        StripeCustomerLink.objects.select_for_update()
        .filter(customer_id=customer, unlinked_at__isnull=True)
        .select_related("tenant")
        .first()
    )


def _invoice_of(event: dict[str, Any]) -> tuple[StripeCustomerLink, StripeInvoice] | None:
    """The invoice event's customer link (locked) and the invoice's record, created on first
    sight; None if the customer is linked to no tenant."""
    invoice = _object(event)
    link = _link(invoice["customer"])
    if link is None:
        return None
    record = StripeInvoice.objects.get_or_create(tenant_id=link.tenant_id, invoice_id=invoice["id"])
    return link, record[0]


def _payment_alert(
    event: dict[str, Any], link: StripeCustomerLink, action: str, now: datetime
) -> None:
    """The payment.failed alert, once per Stripe event, in the webhook's transaction."""
    alert_emit(
        "payment.failed",
        tenant=link.tenant,
        body={
            "tenant": link.tenant.external_id,
            "invoice_id": str(_object(event)["id"]),
            "stripe_event_id": str(event["id"]),
            "action": action,
            "failed_at": time_field(now),
        },
        dedupe_key=f"payment.failed:{event['id']}",
        now=now,
    )


def _payment_failed(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    if conf.STRIPE_ON_PAYMENT_FAILED != "trip":
        linked = (
            StripeCustomerLink.objects.filter(
                customer_id=_object(event)["customer"], unlinked_at__isnull=True
            )
            .select_related("tenant")
            .first()
        )
        if linked is not None:
            _payment_alert(event, linked, "ignore", now)
        return "payment failed: ignored (STRIPE_ON_PAYMENT_FAILED='ignore')"
    found = _invoice_of(event)
    if found is None:
        return "no linked tenant"
    link, record = found
    invoice_id = record.invoice_id
    if record.settled_at is not None:
        return f"invoice {invoice_id} was already {record.settled_as}: a late failure, ignored"
    _payment_alert(event, link, "trip", now)
    if record.payment_failed_at is None:
        record.payment_failed_at, record.failed_event = now, event["id"]
        record.save(update_fields=["payment_failed_at", "failed_event"])
    ours = link.payment_switch
    if ours is not None and ours.cleared_at is None:
        return f"invoice {invoice_id} added to those kill switch {ours.pk} waits on"
    if ours is not None:
        # A person cleared our switch: the invoices it waited on were forgiven then.
        _forgive(link, ours.cleared_by, now, but=invoice_id)
    scope = switch_scope(tenant=link.tenant.external_id)
    assert scope is not None
    switch = kill_switch_trip(
        scope=scope,
        reason=f"Stripe invoice {invoice_id} payment failed (event {event['id']})",
        actor=ACTOR,
        automatic=True,
        detector=DETECTOR,
        now=now,
    )
    if switch.detector != DETECTOR:
        return f"tenant already stopped by kill switch {switch.pk} (not ours: left alone)"
    link.payment_switch = switch
    link.save(update_fields=["payment_switch"])
    return f"tripped kill switch {switch.pk}"


def _forgive(link: StripeCustomerLink, cleared_by: str, now: datetime, *, but: str) -> None:
    StripeInvoice.objects.filter(
        tenant_id=link.tenant_id, payment_failed_at__isnull=False, settled_at__isnull=True
    ).exclude(invoice_id=but).update(
        settled_at=now,
        settled_as=InvoiceSettlement.FORGIVEN,
        settled_event=f"switch cleared by {cleared_by}"[:255],
    )


def _settled(
    how: InvoiceSettlement,
) -> Callable[[dict[str, Any], StripeWebhookEvent, datetime], str]:
    """The handler of an event that settles an invoice (paid, voided): the payment switch clears
    once no invoice whose failure it waits on is left unsettled."""

    def handle(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
        found = _invoice_of(event)
        if found is None:
            return "no linked tenant"
        link, record = found
        invoice_id = record.invoice_id
        if record.settled_at is None:
            record.settled_at, record.settled_as, record.settled_event = now, how, event["id"]
            record.save(update_fields=["settled_at", "settled_as", "settled_event"])
        switch = link.payment_switch
        if switch is None:
            return f"invoice {invoice_id} {how.value}; nothing to clear"
        if switch.cleared_at is not None:
            return f"invoice {invoice_id} {how.value}; kill switch {switch.pk} was already cleared"
        unpaid = unpaid_invoices(link.tenant_id)
        if unpaid:
            return (
                f"invoice {invoice_id} {how.value}; kill switch {switch.pk} still waits on "
                + ", ".join(unpaid)
            )[:255]
        link.payment_switch = None
        link.save(update_fields=["payment_switch"])
        kill_switch_clear(
            switch_id=switch.pk,
            reason=f"Stripe invoice {invoice_id} {how.value} (event {event['id']}): no failed "
            "invoice left unpaid",
            actor=ACTOR,
            now=now,
        )
        return f"cleared kill switch {switch.pk}"

    return handle


def _customer_deleted(event: dict[str, Any], row: StripeWebhookEvent, now: datetime) -> str:
    link = _link(_object(event)["id"])
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
    for error_type in _dicts(_dict(_dict(data).get("reason")).get("error_types")):
        code = str(error_type.get("code") or "")[:100]
        for sample in _dicts(error_type.get("sample_errors")):
            identifier = str(_dict(sample.get("request")).get("identifier") or "")[:100]
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


def _dict(value: object) -> dict[str, Any]:
    """A part of a report that should be an object: anything else reads as empty."""
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


HANDLERS: dict[str, Callable[[dict[str, Any], StripeWebhookEvent, datetime], str]] = {
    "invoice.payment_failed": _payment_failed,
    "invoice.paid": _settled(InvoiceSettlement.PAID),
    "invoice.voided": _settled(InvoiceSettlement.VOIDED),
    "customer.deleted": _customer_deleted,
    "v1.billing.meter.error_report_triggered": _meter_error,
    "v1.billing.meter.no_meter_found": _meter_error,
    **topups.HANDLERS,  # prepaid top-ups, refunds and disputes
}
