"""Stripe webhooks: verify, store raw, process once, in a transaction.

The view (:mod:`llm_budgets.billing.views`) refuses a request whose signature does not verify
before anything is stored. :func:`webhook_receive` stores the event by its id (Stripe retries a
delivery until it gets a 2xx, so the same id may arrive many times), processes it once in a
transaction, and on failure stores the error and raises, so the view answers 500 and Stripe
retries. A signed event whose shape is not a Stripe event's (a field of the wrong type, an id
longer than any Stripe writes, JSON nested deeper than :data:`MAX_DEPTH`) is refused with
:class:`WebhookPayloadError` (400, logged) before anything is stored.

The payment switch (``STRIPE_ON_PAYMENT_FAILED="trip"``): a failed invoice trips the tenant's
switch, and it clears only once every invoice whose failure it waits on is settled: paid or
voided (``StripeInvoice``). Stripe does not order deliveries, so a paid invoice is remembered and
its late failure trips nothing; "marked uncollectible" settles nothing (the debt stands, and a
person decides).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from llm_budgets.alerts.bodies import time_field
from llm_budgets.alerts.emit import alert_emit
from llm_budgets.billing import topups
from llm_budgets.billing.links import stripe_customer_unlink
from llm_budgets.billing.totals import unpaid_invoices
from llm_budgets.conf import conf
from llm_budgets.control.killswitches import (
    PAYMENT_FAILED_DETECTOR,
    kill_switch_clear,
    kill_switch_trip,
    switch_scope,
)
from llm_budgets.exceptions import Fault, InvalidUsage
from llm_budgets.models import (
    InvoiceSettlement,
    MeterDelivery,
    MeterErrorReport,
    StripeCustomerLink,
    StripeInvoice,
    StripeWebhookEvent,
)

logger = logging.getLogger(__name__)

ACTOR = "stripe webhook"
DETECTOR = PAYMENT_FAILED_DETECTOR


class WebhookSignatureError(InvalidUsage):
    """The request is not signed by Stripe with the configured secret: nothing was stored."""

    fault = Fault.CALLER  # the sender's (a forger, or a secret that does not match)


class WebhookPayloadError(InvalidUsage):
    """Signed, but not the shape of a Stripe event this app reads: nothing was stored."""

    fault = Fault.CALLER


# Stripe's ids are far shorter; the columns that keep them hold 255 characters.
MAX_ID_LENGTH = 255
# Stripe's events nest a few levels; deeper JSON is refused before it is decoded (the decoder
# would recurse once per level).
MAX_DEPTH = 64


def webhook_verify(*, payload: bytes, signature: str | None) -> dict[str, Any]:
    """The event if ``payload`` is signed with ``STRIPE_WEBHOOK_SECRET`` (and fresh), and has the
    shape of a Stripe event (else ``WebhookPayloadError``)."""
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
    except (stripe.SignatureVerificationError, ValueError, UnicodeDecodeError) as exc:
        raise WebhookSignatureError(
            f"Invalid signature or payload: {exc}", field="signature"
        ) from None
    if _depth(payload) > MAX_DEPTH:
        raise WebhookPayloadError(
            f"The payload nests deeper than {MAX_DEPTH} levels: not a Stripe event.",
            field="payload",
        )
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise WebhookPayloadError(f"The payload is not JSON: {exc}", field="payload") from None
    if not isinstance(event, dict):
        raise WebhookPayloadError("The payload is not a Stripe event.", field="payload")
    _text(event, "id", where="event")
    _text(event, "type", where="event")
    data = event.get("data")
    if data is not None and not isinstance(data, dict):
        raise WebhookPayloadError("The event's data is not an object.", field="data")
    obj = (data or {}).get("object")
    if obj is not None and not isinstance(obj, dict):
        raise WebhookPayloadError("The event's data.object is not an object.", field="data.object")
    if event["type"] in _INVOICE_EVENTS:
        _text(obj or {}, "id", where="data.object")
        _text(obj or {}, "customer", where="data.object")
    elif event["type"] == "customer.deleted" or event["type"] in topups.HANDLERS:
        _text(obj or {}, "id", where="data.object")
    return event


def _text(obj: dict[str, Any], key: str, *, where: str) -> str:
    """``obj[key]``, a non-empty string of at most MAX_ID_LENGTH characters."""
    value = obj.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        shown = type(value).__name__ if not isinstance(value, str) else f"{len(value)} characters"
        raise WebhookPayloadError(
            f"{where}.{key} must be a string of 1 to {MAX_ID_LENGTH} characters; got {shown}.",
            field=f"{where}.{key}",
        )
    return value


def _depth(payload: bytes) -> int:
    """How deep the JSON text nests (brackets outside strings), without decoding it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def error_text(exc: Exception) -> str:
    """What is stored and answered for a processing failure: a database's own message (which may
    quote SQL or values) stays in the log."""
    if isinstance(exc, DatabaseError):
        return f"{type(exc).__name__} (database error; details in the log)"
    return f"{type(exc).__name__}: {exc}"[:1000]


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
            error=error_text(exc), attempts=row.attempts + 1
        )
        logger.exception("Stripe webhook %s (%s) failed", event["id"], event["type"])
        raise


# The events whose data.object is an invoice naming its customer (checked by webhook_verify).
_INVOICE_EVENTS = ("invoice.payment_failed", "invoice.paid", "invoice.voided")


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
