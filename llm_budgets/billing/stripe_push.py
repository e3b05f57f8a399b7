"""The Stripe push (task ``llm_budgets.stripe_push``, command ``llm_budgets_stripe_push``,
:func:`stripe_push`): pending outbox rows become meter events, one per customer, meter and closed
hour (each a :class:`MeterDelivery` row), and are sent to Stripe exactly once.

1. **Build** (:func:`deliveries_build`): per customer and meter, in one transaction, lock the
   customer's balance and claim its pending rows of closed hours with
   ``select_for_update(skip_locked=True)``; write one :class:`MeterDelivery` per hour (a late row
   for an hour already sent makes a new delta delivery, never a resend of the total). Its value is
   in millionths of the currency unit: ``round(exact total so far) - units so far``, so the
   remainder is carried per customer and what was sent never differs from the ledger by more than
   half a unit. A void that fully reverses one delivery sent less than 23 hours ago becomes a
   cancel adjustment of it; any other correction is a negative (compensating) event.
2. **Send** (:func:`deliveries_send`): claim a due delivery (skip-locked, then a lease), send it
   with its identifier (also the Idempotency-Key), record the outcome. A crash between Stripe
   recording it and us recording that leaves it pending: the next run resends the same
   identifier, Stripe answers "already exists", and it is marked sent.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from llm_budgets.alerts.emit import alert_emit
from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.outbox import (
    CATCH_UP_MARGIN,
    STRIPE_WINDOW,
    lines_resolve,
    outbox_catch_up,
)
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.models import (
    BillingLine,
    DeliveryKind,
    MeterDelivery,
    MeterDeliveryState,
    StripeCustomerBalance,
    StripeCustomerLink,
    UsageRecord,
)
from llm_budgets.money import MILLION, ZERO

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
# A sender that took a delivery and vanished (killed) is presumed dead after this long.
CLAIM_SECONDS = 300
# Cancel adjustments are accepted within 24 h of Stripe receiving the event: keep a margin.
CANCEL_WINDOW = timedelta(hours=23)
# Stripe's identifiers are unique over at least 24 h: past that, a resend could double bill.
IDENTIFIER_WINDOW = timedelta(hours=23)
# An event must be at most 35 days old when Stripe receives it: keep an hour's margin.
TOO_OLD_MARGIN = timedelta(hours=1)
MAX_SIGNIFICANT_DIGITS = 15
DUPLICATE_MESSAGE = "already exists with identifier"


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def to_units(amount: Decimal) -> int:
    """Millionths of the currency unit, rounded half-even."""
    return int((amount * MILLION).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def _identifier(prefix: str, *parts: object) -> str:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:40]
    return f"llmb-{prefix}-{digest}"


# -- build ----------------------------------------------------------------------------------------


def deliveries_build(*, now: datetime | None = None) -> int:
    """Build deliveries from the pending rows of closed hours. Returns how many it built."""
    now = now or timezone.now()
    closed = hour_of(now)
    groups = (
        BillingLine.objects.filter(delivery__isnull=True, occurred_at__lt=closed)
        .values_list("customer_id", "event_name")
        .distinct()
        .order_by("customer_id", "event_name")
    )
    return sum(_build_for(customer, event, now) for customer, event in list(groups))


def _balance(customer: str, event: str) -> None:
    try:
        with transaction.atomic():
            StripeCustomerBalance.objects.get_or_create(customer_id=customer, event_name=event)
    except IntegrityError:
        pass  # a concurrent builder created it


def _build_for(customer: str, event: str, now: datetime) -> int:
    _balance(customer, event)
    closed = hour_of(now)
    with transaction.atomic():
        balance = (
            StripeCustomerBalance.objects.select_for_update(skip_locked=True)
            .filter(customer_id=customer, event_name=event)
            .first()
        )
        if balance is None:
            return 0  # another worker is building this customer's deliveries
        claimed = list(
            BillingLine.objects.select_for_update(skip_locked=True)
            .filter(
                customer_id=customer,
                event_name=event,
                delivery__isnull=True,
                occurred_at__lt=closed,
            )
            .order_by("occurred_at", "pk")
        )
        if not claimed:
            return 0
        lines_resolve(Q(pk__in=[line.pk for line in claimed]))
        claimed = list(
            BillingLine.objects.filter(pk__in=[line.pk for line in claimed])
            .select_related("usage_record")
            .order_by("occurred_at", "pk")
        )
        builder = _Builder(balance=balance, customer=customer, event=event, now=now)
        rest = builder.cancellations(claimed)
        builder.hourly(rest)
        balance.save(update_fields=["exact", "units"])
        return builder.built


@dataclass
class _Builder:
    balance: StripeCustomerBalance
    customer: str
    event: str
    now: datetime
    built: int = 0
    _tenant_id: int | None = field(default=None)

    def _voided_line(self, line: BillingLine) -> BillingLine | None:
        record = line.usage_record
        if record is None or record.voids_id is None:
            return None
        voided: UsageRecord = record.voids  # type: ignore[assignment]
        return (
            BillingLine.objects.filter(
                Q(usage_record_id=voided.pk)
                | Q(reservation_id=voided.reservation_id, kind=voided.kind)
            )
            .select_related("delivery")
            .first()
        )

    def cancellations(self, claimed: list[BillingLine]) -> list[BillingLine]:
        """Voids that fully reverse a delivery sent less than 23 h ago become its cancel
        adjustment; a void of a row claimed now joins that row's hour (they net out). Returns
        the rows left for hourly events."""
        claimed_ids = {line.pk for line in claimed}
        by_delivery: dict[int, list[BillingLine]] = defaultdict(list)
        voided_of: dict[int, BillingLine] = {}
        for line in claimed:
            voided = self._voided_line(line)
            if voided is None:
                continue
            voided_of[line.pk] = voided
            if voided.delivery is not None and voided.delivery.state == MeterDeliveryState.TOO_OLD:
                # The voided usage was never sent (too old for Stripe): nothing to credit.
                line.amount = ZERO
                BillingLine.objects.filter(pk=line.pk).update(amount=ZERO)
            elif voided.delivery_id is not None:
                by_delivery[voided.delivery_id].append(line)
        taken: set[int] = set()
        for delivery_id, voids in by_delivery.items():
            original = MeterDelivery.objects.get(pk=delivery_id)
            covered = {voided_of[v.pk].pk for v in voids}
            if (
                original.kind != DeliveryKind.EVENT
                or original.state != MeterDeliveryState.SENT
                or original.sent_at is None
                or original.sent_at < self.now - CANCEL_WINDOW
                or MeterDelivery.objects.filter(cancels=original).exists()
                or set(original.lines.values_list("pk", flat=True)) != covered
            ):
                continue
            amount = sum((v.amount for v in voids), ZERO)
            exact = self.balance.exact + amount
            units = self.balance.units - original.units
            if abs(exact * MILLION - units) > 1:
                continue  # the carried remainder would drift: send a compensating event
            self.balance.exact, self.balance.units = exact, units
            self._create(
                voids,
                kind=DeliveryKind.CANCEL,
                cancels=original,
                hour=original.hour,
                timestamp=original.timestamp,
                amount=amount,
                units=-original.units,
                identifier=_identifier("cancel", original.identifier),
            )
            taken.update(v.pk for v in voids)
        rest = [line for line in claimed if line.pk not in taken]
        # A void of a row that is itself pending goes into that row's hour, so the two net out.
        self._hour_override = {
            line.pk: hour_of(voided_of[line.pk].occurred_at)
            for line in rest
            if line.pk in voided_of and voided_of[line.pk].pk in claimed_ids
        }
        return rest

    def hourly(self, lines: Iterable[BillingLine]) -> None:
        overrides = getattr(self, "_hour_override", {})
        by_hour: dict[datetime, list[BillingLine]] = defaultdict(list)
        for line in lines:
            by_hour[overrides.get(line.pk, hour_of(line.occurred_at))].append(line)
        for hour in sorted(by_hour):
            group = by_hour[hour]
            amount = sum((line.amount for line in group), ZERO)
            timestamp = max(line.occurred_at for line in group).replace(microsecond=0)
            timestamp = min(max(timestamp, hour), hour + HOUR - timedelta(seconds=1))
            identifier = _identifier(
                "h", self.customer, self.event, hour.isoformat(), *sorted(x.pk for x in group)
            )
            if timestamp < self.now - STRIPE_WINDOW + TOO_OLD_MARGIN:
                self._create(
                    group,
                    kind=DeliveryKind.EVENT,
                    hour=hour,
                    timestamp=timestamp,
                    amount=amount,
                    units=to_units(amount),
                    identifier=identifier,
                    state=MeterDeliveryState.TOO_OLD,
                    note="older than Stripe's 35-day window: not sent; bill it another way",
                )
                continue
            self.balance.exact += amount
            target = to_units(self.balance.exact)
            units, self.balance.units = target - self.balance.units, target
            self._create(
                group,
                kind=DeliveryKind.EVENT,
                hour=hour,
                timestamp=timestamp,
                amount=amount,
                units=units,
                identifier=identifier,
                state=MeterDeliveryState.PENDING if units else MeterDeliveryState.EMPTY,
                note="" if units else "rounds to zero units: carried forward",
            )

    def _create(
        self,
        lines: list[BillingLine],
        *,
        state: str = MeterDeliveryState.PENDING,
        note: str = "",
        **values: Any,
    ) -> MeterDelivery:
        delivery = MeterDelivery.objects.create(
            tenant_id=lines[0].tenant_id,
            customer_id=self.customer,
            event_name=self.event,
            currency=lines[0].currency,
            state=state,
            note=note,
            next_attempt_at=self.now,
            created_at=self.now,
            **values,
        )
        BillingLine.objects.filter(pk__in=[line.pk for line in lines]).update(delivery=delivery)
        self.built += 1
        return delivery


# -- send -----------------------------------------------------------------------------------------


@dataclass
class PushResult:
    queued: int = 0
    built: int = 0
    sent: int = 0
    retrying: int = 0
    parked: int = 0

    def __str__(self) -> str:
        return (
            f"{self.queued} late row(s) queued, {self.built} delivery(ies) built, "
            f"{self.sent} sent, {self.retrying} to retry, {self.parked} parked"
        )


def _claim(now: datetime) -> MeterDelivery | None:
    """Take one due delivery: skip rows another worker holds, then lease it for the send."""
    with transaction.atomic():
        delivery = (
            MeterDelivery.objects.select_for_update(skip_locked=True)
            .filter(state=MeterDeliveryState.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "pk")
            .first()
        )
        if delivery is None:
            return None
        delivery.next_attempt_at = now + timedelta(seconds=CLAIM_SECONDS)
        delivery.attempts += 1
        delivery.first_attempt_at = delivery.first_attempt_at or now
        delivery.save(update_fields=["next_attempt_at", "attempts", "first_attempt_at"])
        return delivery


def deliveries_send(*, now: datetime | None = None, limit: int | None = None) -> PushResult:
    """Send every due delivery (each claimed by one worker only). Returns the counts."""
    import stripe

    now = now or timezone.now()
    client = stripe_client()
    result = PushResult()
    while limit is None or result.sent + result.retrying + result.parked < limit:
        delivery = _claim(now)
        if delivery is None:
            break
        outcome = _send(client, stripe, delivery, now)
        setattr(result, outcome, getattr(result, outcome) + 1)
    return result


def _send(client: Any, stripe: Any, delivery: MeterDelivery, now: datetime) -> str:
    if (
        delivery.kind == DeliveryKind.EVENT
        and delivery.attempts > 1
        and delivery.first_attempt_at is not None
        and delivery.first_attempt_at < now - IDENTIFIER_WINDOW
    ):
        return _park(
            delivery,
            code="outcome_unknown",
            message="First sent more than 23 h ago and never confirmed: Stripe no longer "
            "rejects a repeat of its identifier, so resending could bill twice. Check the "
            "reconciliation for its hour, then retry it or leave it.",
        )
    if len(str(abs(delivery.units)).lstrip("0")) > MAX_SIGNIFICANT_DIGITS:
        return _park(
            delivery,
            code="value_too_large",
            message=f"{delivery.units} has more than 15 significant digits (Stripe's limit).",
        )
    try:
        if delivery.kind == DeliveryKind.CANCEL:
            assert delivery.cancels is not None
            client.v1.billing.meter_event_adjustments.create(
                params={
                    "event_name": delivery.event_name,
                    "type": "cancel",
                    "cancel": {"identifier": delivery.cancels.identifier},
                },
                options={"idempotency_key": _idempotency_key(delivery)},
            )
        else:
            client.v1.billing.meter_events.create(
                params={
                    "event_name": delivery.event_name,
                    "identifier": delivery.identifier,
                    "timestamp": int(delivery.timestamp.timestamp()),
                    "payload": {
                        "stripe_customer_id": delivery.customer_id,
                        "value": str(delivery.units),
                    },
                },
                options={"idempotency_key": _idempotency_key(delivery)},
            )
    except stripe.InvalidRequestError as exc:
        message = str(getattr(exc, "user_message", None) or exc)
        if delivery.kind == DeliveryKind.EVENT and DUPLICATE_MESSAGE in message:
            return _sent(delivery, now, note="Stripe already had it (duplicate identifier)")
        if delivery.kind == DeliveryKind.CANCEL:
            return _compensate(delivery, now, exc)
        return _park(delivery, exc=exc)
    except (stripe.APIConnectionError, stripe.RateLimitError, stripe.APIError) as exc:
        return _retry(delivery, now, exc)
    except stripe.StripeError as exc:
        return _park(delivery, exc=exc)
    return _sent(delivery, now)


def _idempotency_key(delivery: MeterDelivery) -> str:
    if delivery.retries:
        return f"{delivery.identifier}-retry{delivery.retries}"
    return delivery.identifier


def _error_fields(exc: Any) -> dict[str, str]:
    return {
        "error_code": str(getattr(exc, "code", None) or type(exc).__name__)[:100],
        "error_message": str(getattr(exc, "user_message", None) or exc),
        "request_id": str(getattr(exc, "request_id", None) or ""),
    }


def _save(delivery: MeterDelivery, **values: Any) -> None:
    for name, value in values.items():
        setattr(delivery, name, value)
    MeterDelivery.objects.filter(pk=delivery.pk).update(**values)


def _sent(delivery: MeterDelivery, now: datetime, note: str = "") -> str:
    _save(
        delivery,
        state=MeterDeliveryState.SENT,
        sent_at=now,
        note=note or delivery.note,
        error_code="",
        error_message="",
    )
    return "sent"


def _retry(delivery: MeterDelivery, now: datetime, exc: Any) -> str:
    if delivery.attempts >= conf.STRIPE_MAX_ATTEMPTS:
        return _park(
            delivery,
            exc=exc,
            note=f"gave up after {delivery.attempts} attempts (transient errors)",
        )
    delay = min(conf.STRIPE_RETRY_BASE_SECONDS * 2 ** (delivery.attempts - 1), 6 * 60 * 60)
    _save(delivery, next_attempt_at=now + timedelta(seconds=delay), **_error_fields(exc))
    logger.warning("Stripe delivery %s will retry in %ss: %s", delivery.pk, delay, exc)
    return "retrying"


def _park(
    delivery: MeterDelivery,
    *,
    exc: Any = None,
    code: str = "",
    message: str = "",
    note: str = "",
) -> str:
    fields = (
        _error_fields(exc) if exc is not None else {"error_code": code, "error_message": message}
    )
    with transaction.atomic():
        _save(delivery, state=MeterDeliveryState.PARKED, note=note or delivery.note, **fields)
        # Operators only: a parked delivery is the installation's problem, not the tenant's.
        alert_emit(
            "stripe.delivery_parked",
            body={
                "delivery_id": delivery.pk,
                "customer_id": delivery.customer_id,
                "event_name": delivery.event_name,
                "error": str(fields["error_message"])[:1000],
                "parked_at": time_field(timezone.now()),
            },
            guard=f"Stripe delivery {delivery.pk}",
        )
    logger.error("Stripe delivery %s parked: %s", delivery.pk, fields["error_message"])
    return "parked"


def _compensate(delivery: MeterDelivery, now: datetime, exc: Any) -> str:
    """Stripe refused the cancel (e.g. past its 24 h): send the reversal as a negative event."""
    _save(
        delivery,
        kind=DeliveryKind.EVENT,
        identifier=_identifier("comp", delivery.identifier),
        hour=hour_of(now),
        timestamp=now.replace(microsecond=0),
        next_attempt_at=now,
        note=f"cancel refused ({exc}); sent as a compensating event",
    )
    return "retrying"


def delivery_retry(*, delivery_id: int, actor: str = "", now: datetime | None = None) -> bool:
    """A person retries a parked delivery once its cause is fixed. Returns whether it was."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = MeterDelivery.objects.filter(
            pk=delivery_id, state=MeterDeliveryState.PARKED
        ).update(
            state=MeterDeliveryState.PENDING,
            attempts=0,
            retries=F("retries") + 1,
            first_attempt_at=None,
            next_attempt_at=now,
            note=f"retried by {actor or 'staff'} at {now:%Y-%m-%d %H:%M} UTC",
        )
    return bool(changed)


def stripe_push(*, now: datetime | None = None) -> PushResult:
    """What ``llm_budgets_stripe_push`` and the Celery task do: queue the rows that processes
    unaware of a recent link missed, build deliveries of closed hours, send what is due."""
    now = now or timezone.now()
    queued = 0
    for link in StripeCustomerLink.objects.filter(
        unlinked_at__isnull=True, caught_up_at__isnull=True
    ).select_related("tenant"):
        with transaction.atomic():
            queued += outbox_catch_up(
                tenant=link.tenant, now=now, since=link.linked_at - CATCH_UP_MARGIN
            )
            if now >= link.linked_at + CATCH_UP_MARGIN:
                # Every process has seen the link by now, and every line it missed is queued.
                StripeCustomerLink.objects.filter(pk=link.pk).update(caught_up_at=now)
    built = deliveries_build(now=now)
    result = deliveries_send(now=now)
    result.queued, result.built = queued, built
    return result


__all__ = [
    "PushResult",
    "deliveries_build",
    "deliveries_send",
    "delivery_retry",
    "hour_of",
    "stripe_push",
    "to_units",
]
