"""Delivery of the alert outbox (docs/alerts.md, "Delivery"): each endpoint's pending deliveries,
in the order they were written, one sender at a time per endpoint.

- **Order**: a sender takes the endpoint's lease (a conditional UPDATE), then sends its oldest
  pending delivery, and the next only once that one is delivered or given up. A failing head
  holds the rest back: order over throughput.
- **At least once, deduplicable**: the attempt is recorded before the request goes out; a sender
  killed between a receiver storing a delivery and us recording it leaves it pending, and the
  next sender (once the lease lapses) sends it again with the same delivery id
  (``LLM-Budgets-Delivery``), which the receiver deduplicates on.
- **Retries**: exponential from ``ALERTS_RETRY_BASE_SECONDS``, each wait at most
  ``ALERTS_RETRY_MAX_SECONDS``, with jitter (half to all of it), at least what a ``Retry-After``
  asked; a delivery still failing ``ALERTS_RETRY_HORIZON_SECONDS`` after its first attempt is
  given up (``failed``; a person can redeliver it).
- **Disabling**: ``ALERTS_DISABLE_AFTER_FAILURES`` failed attempts in a row disable the endpoint
  and email its owner; its deliveries wait until it is enabled.
"""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.mail import EmailMessage, send_mail
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from llm_budgets.alerts import formats, transport
from llm_budgets.alerts.endpoints import endpoint_disable, endpoint_recipients, endpoint_secrets
from llm_budgets.alerts.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, sign
from llm_budgets.conf import conf
from llm_budgets.models import AlertDelivery, AlertDeliveryState, AlertEndpoint, EndpointKind
from llm_budgets.models.fields import split_emails

logger = logging.getLogger("llm_budgets")

ACTOR = "llm_budgets alerts"
# Deliveries one run sends to one endpoint before the next endpoint's turn: a backlog at one
# endpoint never starves the others (the next run continues it).
ENDPOINT_BATCH = 100


@dataclass
class DeliverResult:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    disabled: int = 0

    def __str__(self) -> str:
        return (
            f"{self.delivered} delivered, {self.retrying} to retry, {self.failed} given up, "
            f"{self.disabled} endpoints disabled"
        )


def lease_seconds() -> int:
    """How long a sender holds an endpoint: longer than one attempt, so a live sender keeps it;
    a killed one's lapses this long after its last renewal."""
    return conf.ALERTS_TIMEOUT_SECONDS * 2 + 5


def retry_delay(attempts: int, retry_after: float | None = None) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones."""
    base = conf.ALERTS_RETRY_BASE_SECONDS * 2 ** min(max(attempts - 1, 0), 30)
    capped = min(base, conf.ALERTS_RETRY_MAX_SECONDS)
    delay = capped * random.uniform(0.5, 1.0)  # noqa: S311 (jitter, not a secret)
    return max(delay, retry_after or 0.0)


def alerts_due_endpoints(now: datetime) -> list[int]:
    """Enabled endpoints with a delivery due."""
    return list(
        AlertDelivery.objects.filter(
            state=AlertDeliveryState.PENDING, next_attempt_at__lte=now, endpoint__enabled=True
        )
        .order_by("endpoint_id")
        .values_list("endpoint_id", flat=True)
        .distinct()
    )


def alerts_deliver(*, now: datetime | None = None) -> DeliverResult:
    """Send what is due, endpoint by endpoint. Returns what happened."""
    result = DeliverResult()
    for endpoint_id in alerts_due_endpoints(now or timezone.now()):
        endpoint_deliver(endpoint_id, result=result)
    return result


def _lease(endpoint_id: int, token: str) -> bool:
    now = timezone.now()
    free = Q(leased_until__isnull=True) | Q(leased_until__lt=now) | Q(lease_token=token)
    return bool(
        AlertEndpoint.objects.filter(free, pk=endpoint_id, enabled=True).update(
            lease_token=token, leased_until=now + timedelta(seconds=lease_seconds())
        )
    )


def endpoint_deliver(
    endpoint_id: int, *, result: DeliverResult | None = None, limit: int = ENDPOINT_BATCH
) -> DeliverResult:
    """Send up to ``limit`` of the endpoint's due deliveries in order, unless another sender has
    it."""
    result = result or DeliverResult()
    token = uuid.uuid4().hex
    try:
        # The lease is renewed before each delivery: a sender that lost it stops.
        for _ in range(limit):
            if not _lease(endpoint_id, token):
                break
            head = (
                AlertDelivery.objects.filter(
                    endpoint_id=endpoint_id, state=AlertDeliveryState.PENDING
                )
                .select_related("event__tenant", "endpoint__tenant")
                .order_by("pk")
                .first()
            )
            if head is None or head.next_attempt_at > timezone.now():
                break
            # A retry holds the queue back (order); a delivery given up lets the next go.
            if _attempt(head, result) == AlertDeliveryState.PENDING:
                break
    finally:
        AlertEndpoint.objects.filter(pk=endpoint_id, lease_token=token).update(
            lease_token="", leased_until=None
        )
    return result


def _send(delivery: AlertDelivery) -> int | None:
    """One attempt; the status code (None for email), or ``DeliveryFailed``."""
    endpoint, event = delivery.endpoint, delivery.event
    headers = {DELIVERY_HEADER: delivery.uid, EVENT_HEADER: event.type}
    if endpoint.kind == EndpointKind.EMAIL:
        recipients = endpoint_recipients(endpoint)  # only addresses that confirmed
        if not recipients:
            raise transport.DeliveryFailed(
                "no address of this endpoint has confirmed yet (each was sent a link)"
            )
        subject, body = formats.email(event)
        sender = conf.WARNING_FROM_EMAIL
        domain = sender.rpartition("@")[2].rstrip(">") or "localhost"
        message = EmailMessage(
            subject=subject,
            body=body,
            from_email=sender,
            to=recipients,
            # Stable across attempts: a duplicate is recognisable.
            headers={"Message-ID": f"<{delivery.uid}@{domain}>", **headers},
        )
        try:
            message.send()
        except Exception as exc:
            raise transport.DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
        return None
    if endpoint.kind == EndpointKind.SLACK:
        payload = formats.slack(event)
    elif endpoint.kind == EndpointKind.TEAMS:
        payload = formats.teams(event)
    else:
        payload = formats.envelope(event)
        headers[SIGNATURE_HEADER] = sign(payload, endpoint_secrets(endpoint, timezone.now()))
    return transport.post(endpoint.target, payload, headers).status


def _attempt(delivery: AlertDelivery, result: DeliverResult) -> str:
    now = timezone.now()
    # Recorded before sending: a sender killed mid-attempt leaves the count right.
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        attempts=F("attempts") + 1,
        last_attempt_at=now,
        first_attempt_at=delivery.first_attempt_at or now,
    )
    attempts = delivery.attempts + 1
    first = delivery.first_attempt_at or now
    try:
        status = _send(delivery)
    except transport.DeliveryFailed as exc:
        return _failed(delivery, exc, attempts, first, result)
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        state=AlertDeliveryState.DELIVERED,
        delivered_at=timezone.now(),
        last_status_code=status,
        last_error="",
    )
    AlertEndpoint.objects.filter(pk=delivery.endpoint_id).update(consecutive_failures=0)
    result.delivered += 1
    return AlertDeliveryState.DELIVERED


def _failed(
    delivery: AlertDelivery,
    exc: transport.DeliveryFailed,
    attempts: int,
    first: datetime,
    result: DeliverResult,
) -> str:
    now = timezone.now()
    horizon = first + timedelta(seconds=conf.ALERTS_RETRY_HORIZON_SECONDS)
    next_at = now + timedelta(seconds=retry_delay(attempts, exc.retry_after))
    state = AlertDeliveryState.FAILED if next_at > horizon else AlertDeliveryState.PENDING
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        state=state,
        next_attempt_at=next_at,
        last_status_code=exc.status,
        last_error=str(exc)[:2000],
    )
    if state == AlertDeliveryState.FAILED:
        result.failed += 1
        logger.error("llm_budgets: alert delivery %s given up: %s", delivery.uid, exc)
    else:
        result.retrying += 1
        logger.warning("llm_budgets: alert delivery %s will retry: %s", delivery.uid, exc)
    endpoints = AlertEndpoint.objects.filter(pk=delivery.endpoint_id)
    endpoints.update(consecutive_failures=F("consecutive_failures") + 1)
    failures = endpoints.values_list("consecutive_failures", flat=True).first() or 0
    if failures >= conf.ALERTS_DISABLE_AFTER_FAILURES:
        _disable(delivery.endpoint, failures, exc)
        result.disabled += 1
    return state


def owner_emails(endpoint: AlertEndpoint) -> list[str]:
    """Who is told about the endpoint: its contacts, else its tenant's billing contacts, else
    (installation-wide) the operators."""
    if endpoint.contact_emails:
        return split_emails(endpoint.contact_emails)
    if endpoint.tenant is not None and endpoint.tenant.billing_contacts:
        return endpoint.tenant.billing_contacts
    return conf.OPERATOR_EMAILS


def _disable(endpoint: AlertEndpoint, failures: int, exc: Exception) -> None:
    reason = f"{failures} failed attempts in a row; the last: {exc}"[:255]
    with transaction.atomic():
        endpoint_disable(endpoint, reason=reason, actor=ACTOR)
    recipients = owner_emails(endpoint)
    logger.error("llm_budgets: alert endpoint %s disabled: %s", endpoint.pk, reason)
    if not recipients:
        return
    try:
        send_mail(
            f"[llm_budgets] Alert endpoint disabled: {endpoint.target[:80]}",
            f"The {endpoint.get_kind_display()} endpoint {endpoint.pk} ({endpoint.target}) was "
            f"disabled: {reason}\n\nIts deliveries wait; enable it once it answers again and "
            "they are sent, in order.",
            None,
            recipients,
        )
    except Exception:
        logger.exception("llm_budgets: could not email the owner of alert endpoint %s", endpoint.pk)
