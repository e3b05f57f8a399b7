"""Plans, tenants and their end users."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from llm_budgets.models.fields import (
    split_emails,
    validate_email_list,
    validate_thresholds,
    validate_timezone,
)


class Plan(models.Model):
    """A template of limits and policies that tenants subscribe to."""

    name = models.CharField(max_length=100, unique=True)
    default_max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Output ceiling for requests that give none. Empty: such requests are refused.",
    )
    warning_thresholds = models.JSONField(
        null=True,
        blank=True,
        validators=[validate_thresholds],
        help_text="Percentages of a budget that trigger a warning email, e.g. [50, 80, 100]. "
        "Empty: LLM_BUDGETS['WARNING_THRESHOLDS'].",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    """A customer organisation of the host SaaS, keyed by the host's own id."""

    external_id = models.CharField(max_length=255, unique=True)
    name = models.CharField(max_length=255, blank=True)
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.PROTECT, related_name="tenants"
    )
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    billing_day = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(31)],
        help_text="Day of month the monthly period starts (clamped to the month's last day).",
    )
    billing_emails = models.TextField(
        blank=True,
        validators=[validate_email_list],
        help_text="Billing contacts who receive budget warnings: addresses separated by commas "
        "or new lines.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["external_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(billing_day__gte=1, billing_day__lte=31),
                name="llmb_tenant_billing_day_1_31",
            ),
        ]

    def __str__(self) -> str:
        return self.name or self.external_id

    @property
    def billing_contacts(self) -> list[str]:
        """The billing contacts' addresses, in the order given."""
        return split_emails(self.billing_emails)


class EndUser(models.Model):
    """A user inside a tenant, created on first sight."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="end_users")
    external_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "external_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "external_id"], name="llmb_enduser_unique_per_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.external_id}/{self.external_id}"
