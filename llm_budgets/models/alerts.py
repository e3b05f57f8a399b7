"""Alerts (docs/alerts.md): endpoints that subscribe to event types, the events, and the outbox of
deliveries, one row per event and endpoint, written in the transaction that caused the event.

Only ``llm_budgets.alerts`` writes these rows (``emit`` the events and deliveries, ``endpoints``
the endpoints, ``delivery`` the delivery state)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets.models.tenancy import Tenant


class EndpointKind(models.TextChoices):
    WEBHOOK = "webhook", "Signed webhook (JSON)"
    SLACK = "slack", "Slack incoming webhook"
    TEAMS = "teams", "Microsoft Teams incoming webhook"
    EMAIL = "email", "Email"


class AlertEndpoint(models.Model):
    """Where events of the subscribed types go: a tenant's own (its events only) or, without a
    tenant, the installation's operators' (every tenant's events and the installation-wide ones).

    ``secret`` signs webhook deliveries; during a rotation the old one stays valid until
    ``previous_secret_expires_at`` and each delivery carries a signature for both. A secret is
    shown once, when created or rotated; the admin and the API show only ``secret_hint``."""

    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_endpoints",
        help_text="Empty: installation-wide (operators).",
    )
    kind = models.CharField(max_length=10, choices=EndpointKind.choices)
    target = models.CharField(
        max_length=2000, help_text="The URL (webhook, Slack, Teams) or the email addresses."
    )
    event_types = models.JSONField(default=list, help_text="The event types it subscribes to.")
    description = models.CharField(max_length=255, blank=True)
    secret = models.CharField(max_length=100, blank=True, editable=False)
    previous_secret = models.CharField(max_length=100, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=255, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    # The tenant's billing contacts (``ensure_tenant(billing_emails=...)``): an email endpoint
    # like any other, the one the tenant's settings edit; at most one per tenant.
    billing_contacts = models.BooleanField(
        default=False,
        editable=False,
        help_text="The tenant's billing contacts (set by ensure_tenant's billing_emails).",
    )
    contact_emails = models.TextField(
        blank=True,
        help_text="Told when the endpoint is disabled; empty: the tenant's billing contacts "
        "(installation-wide: OPERATOR_EMAILS).",
    )
    # Addresses of an email endpoint a tenant added that receive nothing yet: each was sent a
    # signed link (alerts/confirmation.py) and is sent to once it is followed. Address -> when
    # its link was sent (ISO 8601; "" when sending it failed). Empty: every address confirmed.
    unconfirmed_emails = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="Addresses awaiting confirmation (a link was sent to each): nothing is sent to "
        "them until it is followed.",
    )
    # One sender at a time per endpoint, so its deliveries go out in order.
    lease_token = models.CharField(max_length=32, blank=True, editable=False)
    leased_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["enabled", "tenant"], name="llmb_alert_endpoint_on")]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(billing_contacts=True),
                name="llmb_alert_one_billing_contacts",
            )
        ]

    def __str__(self) -> str:
        owner = f"tenant {self.tenant_id}" if self.tenant_id else "installation"
        return f"{self.get_kind_display()} {self.pk} ({owner})"

    @property
    def secret_hint(self) -> str:
        return f"…{self.secret[-4:]}" if self.secret else ""


class AlertEvent(models.Model):
    """Something that happened, as receivers see it: a stable id, a type, the version of its
    body's schema (``llm_budgets.alerts.bodies``), the body. ``dedupe_key`` makes an event that
    must happen once (a budget exhausted, per budget and period) happen once."""

    uid = models.CharField(max_length=40, unique=True, editable=False)
    type = models.CharField(max_length=64)
    version = models.PositiveSmallIntegerField()
    body = models.JSONField()
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="alert_events",
        help_text="Empty: an installation-wide event (operators only).",
    )
    dedupe_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-pk"]

    def __str__(self) -> str:
        return f"{self.type} {self.uid}"


class AlertDeliveryState(models.TextChoices):
    PENDING = "pending", "Waiting (first attempt or a retry)"
    DELIVERED = "delivered", "Delivered (the endpoint answered 2xx)"
    FAILED = "failed", "Given up (retries ran past the horizon)"


class AlertDelivery(models.Model):
    """One event for one endpoint: the outbox row, written with the event. ``uid`` is the
    delivery id receivers deduplicate on (header ``LLM-Budgets-Delivery``)."""

    uid = models.CharField(max_length=40, unique=True, editable=False)
    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(AlertEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(
        max_length=10, choices=AlertDeliveryState.choices, default=AlertDeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-pk"]
        verbose_name_plural = "alert deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "endpoint"], name="llmb_alert_once_per_endpoint"
            )
        ]
        indexes = [
            # The delivery job's two reads: which endpoints have work due, and each one's queue
            # in order.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state="pending"),
                name="llmb_alert_delivery_due",
            ),
            models.Index(
                fields=["endpoint", "id"],
                condition=Q(state="pending"),
                name="llmb_alert_delivery_queue",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.uid} ({self.state})"
