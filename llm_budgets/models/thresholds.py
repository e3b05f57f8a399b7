"""Warning-threshold crossings: one row per (budget, period, threshold), the claim that makes the
warning email go out once."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets.models.api import ApiKey
from llm_budgets.models.budgets import Budget, Run
from llm_budgets.models.tenancy import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Waiting to be sent"
    SENDING = "sending", "Claimed by a worker that is sending it"
    SENT = "sent", "Sent"
    SKIPPED = "skipped", "Nobody to send to"
    ABANDONED = "abandoned", "Abandoned (at-most-once: a send may have been lost)"


class CrossingKind(models.TextChoices):
    THRESHOLD = "threshold", "Reached a warning threshold"
    # The plan opted in (``Plan.warn_projected``): at the recent burn rate the budget runs out
    # before it resets. ``threshold`` is 100 (the limit).
    PROJECTED = "projected", "Projected to exceed the limit"


class ThresholdCrossing(models.Model):
    """A budget's spent + reserved reached ``threshold`` % of its limit in one period.

    The unique constraint makes detection happen once however many workers scan; the delivery
    fields are the claim a worker takes before sending (see ``llm_budgets.warnings``).
    """

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="crossings")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="crossings"
    )
    end_user = models.ForeignKey(
        EndUser,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="crossings",
        help_text="For an each-end-user budget: whose usage crossed it.",
    )
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="crossings",
        help_text="For an each-run budget: whose usage crossed it.",
    )
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="crossings",
        help_text="For an each-API-key budget: whose usage crossed it.",
    )
    period_start = models.DateTimeField(
        help_text="The period (rolling windows: the span of the window's length) it is once per."
    )
    threshold = models.PositiveSmallIntegerField(help_text="Percent of the limit.")
    kind = models.CharField(
        max_length=10, choices=CrossingKind.choices, default=CrossingKind.THRESHOLD
    )
    projected = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="A projected warning: the spend projected at the end of the period.",
    )
    runs_out_at = models.DateTimeField(
        null=True, blank=True, help_text="A projected warning: when the budget would run out."
    )
    limit = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    spent = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    reserved = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    currency = models.CharField(max_length=3, default="USD")
    crossed_at = models.DateTimeField()
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=32, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    recipients = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-crossed_at"]
        constraints = [
            # Two partial constraints: NULL end users would otherwise never collide.
            models.UniqueConstraint(
                fields=["budget", "period_start", "threshold", "kind"],
                condition=Q(end_user__isnull=True, run__isnull=True, api_key__isnull=True),
                name="llmb_crossing_once_per_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "run", "period_start", "threshold", "kind"],
                condition=Q(run__isnull=False),
                name="llmb_crossing_once_per_run_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "api_key", "period_start", "threshold", "kind"],
                condition=Q(api_key__isnull=False),
                name="llmb_crossing_once_per_key_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "end_user", "period_start", "threshold", "kind"],
                condition=Q(end_user__isnull=False),
                name="llmb_crossing_once_per_user_period",
            ),
            models.CheckConstraint(
                condition=Q(threshold__gte=1, threshold__lte=100),
                name="llmb_crossing_threshold_1_100",
            ),
        ]
        indexes = [models.Index(fields=["state", "claimed_at"], name="llmb_crossing_due")]

    def __str__(self) -> str:
        return f"budget {self.budget_id} reached {self.threshold}% ({self.state})"
