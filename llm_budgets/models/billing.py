"""Stripe metered billing: which tenant bills to which Stripe customer, the outbox written beside
the ledger, the meter events built from it, reconciliation runs and received webhooks.

Only the services in :mod:`llm_budgets.billing` write these tables (docs/billing.md).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets import clock, money
from llm_budgets.models.control import KillSwitch
from llm_budgets.models.ledger import Reservation, UsageKind, UsageRecord
from llm_budgets.models.tenancy import Plan, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class StripeCustomerLink(models.Model):
    """A tenant billed through a Stripe customer. ``unlinked_at`` set: delivery of new usage
    stopped; what was already owed stays in the outbox."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="stripe_link"
    )
    customer_id = models.CharField(max_length=255, db_index=True)
    linked_at = models.DateTimeField()
    linked_by = models.CharField(max_length=255, blank=True)
    unlinked_at = models.DateTimeField(null=True, blank=True)
    # When delivery last added rows that processes unaware of the link missed; empty: not yet
    # done since the link was made (billing.outbox, "catch-up").
    caught_up_at = models.DateTimeField(null=True, blank=True)
    unlink_reason = models.CharField(max_length=255, blank=True)
    # The tenant kill switch this app tripped on a failed payment: cleared once every invoice
    # whose failure it waits on is settled (``StripeInvoice``, docs/billing.md).
    payment_switch = models.ForeignKey(
        KillSwitch, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["tenant_id"]
        verbose_name = "Stripe customer link"

    def __str__(self) -> str:
        state = "unlinked" if self.unlinked_at else "linked"
        return f"{self.tenant_id} -> {self.customer_id} ({state})"

    @property
    def active(self) -> bool:
        return self.unlinked_at is None


class InvoiceSettlement(models.TextChoices):
    PAID = "paid", "paid"
    VOIDED = "voided", "voided"
    FORGIVEN = "forgiven", "switch cleared by a person"


class StripeInvoice(models.Model):
    """An invoice of a linked customer that a payment webhook named. ``payment_failed_at`` set and
    ``settled_at`` empty: unpaid, and the tenant's payment switch waits on it. A settled invoice
    stays, so that a failure Stripe delivers after its payment trips nothing."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    invoice_id = models.CharField(max_length=255)
    payment_failed_at = models.DateTimeField(null=True, blank=True)
    failed_event = models.CharField(max_length=255, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    settled_as = models.CharField(max_length=16, choices=InvoiceSettlement.choices, blank=True)
    settled_event = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["tenant_id", "invoice_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "invoice_id"], name="llmb_stripe_invoice_unique"
            ),
        ]

    def __str__(self) -> str:
        state = self.settled_as or ("payment failed" if self.payment_failed_at else "seen")
        return f"{self.invoice_id} of {self.tenant_id} ({state})"


class StripePlanMeter(models.Model):
    """A plan's own meter event name (default: ``LLM_BUDGETS['STRIPE_METER_EVENT_NAME']``)."""

    plan = models.OneToOneField(
        Plan, on_delete=models.CASCADE, primary_key=True, related_name="stripe_meter"
    )
    event_name = models.CharField(max_length=100)

    class Meta:
        verbose_name = "Stripe meter of a plan"
        verbose_name_plural = "Stripe meters of plans"

    def __str__(self) -> str:
        return f"{self.plan_id}: {self.event_name}"


class StripeMeter(models.Model):
    """The meter and metered price ``llm_budgets_stripe_setup`` created or found in Stripe."""

    event_name = models.CharField(max_length=100, unique=True)
    meter_id = models.CharField(max_length=255)
    price_id = models.CharField(max_length=255, blank=True)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["event_name"]

    def __str__(self) -> str:
        return f"{self.event_name}: {self.meter_id}"


class MeterDeliveryState(models.TextChoices):
    PENDING = "pending", "Pending (due to be sent)"
    SENT = "sent", "Sent (Stripe accepted it)"
    PARKED = "parked", "Parked (Stripe refused it; a person retries it once fixed)"
    TOO_OLD = "too_old", "Too old for Stripe (outside its 35-day window)"
    EMPTY = "empty", "Nothing to send (rounded to zero units)"


class DeliveryKind(models.TextChoices):
    EVENT = "event", "Meter event"
    CANCEL = "cancel", "Cancel adjustment of an earlier event"


class MeterDelivery(models.Model):
    """One meter event (or the cancel of one) for a customer, meter and hour: the sum of the
    outbox lines it was built from, in millionths of the currency unit, with the rounding
    remainder carried per customer (:class:`StripeCustomerBalance`)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="meter_deliveries")
    customer_id = models.CharField(max_length=255)
    event_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=DeliveryKind.choices, default=DeliveryKind.EVENT)
    cancels = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="cancelled_by"
    )
    hour = models.DateTimeField(help_text="Start of the (UTC) hour the usage was booked in.")
    timestamp = models.DateTimeField(help_text="The event's timestamp sent to Stripe.")
    identifier = models.CharField(max_length=100, unique=True)
    amount = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        help_text="Exact sum of its lines at customer price.",
    )
    units = models.BigIntegerField(help_text="Millionths of the currency unit sent to Stripe.")
    currency = models.CharField(max_length=3)
    state = models.CharField(
        max_length=10,
        choices=MeterDeliveryState.choices,
        default=MeterDeliveryState.PENDING,
        db_index=True,
    )
    attempts = models.PositiveIntegerField(default=0)
    # Staff retries of a parked delivery: each uses a fresh Idempotency-Key (Stripe replays the
    # first answer to a key, refusal included) while the identifier still guards against doubles.
    retries = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error_code = models.CharField(max_length=100, blank=True)
    error_message = models.TextField(blank=True)
    request_id = models.CharField(max_length=255, blank=True)
    note = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-hour", "-created_at"]
        verbose_name = "Stripe meter delivery"
        verbose_name_plural = "Stripe meter deliveries"
        permissions = [("retry_meterdelivery", "Can retry a parked Stripe delivery")]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="llmb_delivery_due"),
            models.Index(fields=["customer_id", "hour"], name="llmb_delivery_customer_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.units} for {self.customer_id} at {clock.when(self.hour, None)}"


class BillingLine(models.Model):
    """Outbox: one row per ledger line of a linked tenant, written in the line's transaction.

    Settlement writes it in the same statement batch as the line, naming the line by its
    reservation and kind (``usage_record`` is filled in when the line is claimed); corrections
    and catch-up name the line directly. ``delivery`` empty: not sent yet."""

    usage_record = models.OneToOneField(
        UsageRecord, null=True, blank=True, on_delete=models.PROTECT, related_name="billing_line"
    )
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    kind = models.CharField(max_length=10, choices=UsageKind.choices)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="billing_lines")
    customer_id = models.CharField(max_length=255)
    event_name = models.CharField(max_length=100)
    amount = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, help_text="At customer price."
    )
    currency = models.CharField(max_length=3)
    occurred_at = models.DateTimeField(help_text="When the ledger line was booked.")
    delivery = models.ForeignKey(
        MeterDelivery, null=True, blank=True, on_delete=models.PROTECT, related_name="lines"
    )

    class Meta:
        ordering = ["occurred_at", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "kind"],
                condition=Q(reservation__isnull=False) & ~Q(kind=UsageKind.ADJUSTMENT),
                name="llmb_billing_line_once_per_settlement",
            ),
        ]
        indexes = [
            models.Index(
                fields=["customer_id", "event_name"],
                condition=Q(delivery__isnull=True),
                name="llmb_billing_line_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {money.money(self.amount, self.currency)} for {self.customer_id}"


class StripeCustomerBalance(models.Model):
    """Per customer and meter: the exact amount built into deliveries and the units they carry,
    so each delivery sends ``round(exact) - units`` and the remainder is carried forward."""

    customer_id = models.CharField(max_length=255)
    event_name = models.CharField(max_length=100)
    exact = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0)
    units = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["customer_id", "event_name"], name="llmb_stripe_balance_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.customer_id}/{self.event_name}: {self.units} units"


class ReconciliationRun(models.Model):
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    customers = models.PositiveIntegerField(default=0)
    hours_checked = models.PositiveIntegerField(default=0)
    differences = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name = "Stripe reconciliation run"

    def __str__(self) -> str:
        if self.error:
            return f"{clock.when(self.started_at, None)} failed"
        return f"{clock.when(self.started_at, None)}: {self.differences} difference(s)"

    @property
    def is_clean(self) -> bool:
        return not self.error and self.differences == 0 and self.finished_at is not None


class ReconciliationDifference(models.Model):
    run = models.ForeignKey(ReconciliationRun, on_delete=models.CASCADE, related_name="diffs")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL)
    customer_id = models.CharField(max_length=255)
    event_name = models.CharField(max_length=100)
    hour = models.DateTimeField()
    delivered_units = models.BigIntegerField(help_text="What our sent deliveries add up to.")
    stripe_units = models.BigIntegerField(help_text="Stripe's meter event summary.")

    class Meta:
        ordering = ["run_id", "customer_id", "hour"]

    def __str__(self) -> str:
        ours, theirs = self.delivered_units, self.stripe_units
        return f"{self.customer_id} {clock.when(self.hour, None)}: {ours} vs {theirs}"


class WebhookEventState(models.TextChoices):
    RECEIVED = "received", "Received (processing failed or under way; Stripe retries it)"
    PROCESSED = "processed", "Processed"
    UNPROCESSABLE = "unprocessable", "Unprocessable (not acted on; a person reprocesses it)"


class StripeWebhookEvent(models.Model):
    """A webhook event as received (its body byte for byte), processed once; ``error`` keeps the
    last failure, or why the event is unprocessable. An event whose own id cannot be stored is
    kept under ``sha256:`` and its body's digest (Stripe redelivers the same body)."""

    id = models.CharField(max_length=255, primary_key=True)
    type = models.CharField(max_length=255)
    body = models.BinaryField(help_text="The request body as received, byte for byte.")
    received_at = models.DateTimeField()
    state = models.CharField(
        max_length=16, choices=WebhookEventState.choices, default=WebhookEventState.RECEIVED
    )
    processed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    outcome = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-received_at"]
        verbose_name = "Stripe webhook event"
        permissions = [("reprocess_stripewebhookevent", "Can reprocess a Stripe webhook event")]
        indexes = [models.Index(fields=["state", "received_at"], name="llmb_webhook_state")]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class MeterErrorReport(models.Model):
    """A meter error Stripe reported (webhook), against the delivery its identifier names."""

    delivery = models.ForeignKey(
        MeterDelivery, null=True, blank=True, on_delete=models.SET_NULL, related_name="errors"
    )
    identifier = models.CharField(max_length=100, blank=True)
    code = models.CharField(max_length=100, blank=True)
    message = models.TextField(blank=True)
    webhook_event = models.ForeignKey(StripeWebhookEvent, on_delete=models.CASCADE)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.code} {self.identifier}"
