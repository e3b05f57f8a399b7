"""Plans, tenants and their end users."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from llm_budgets.models.fields import validate_timezone


class Plan(models.Model):
    """A template of limits and policies that tenants subscribe to."""

    name = models.CharField(max_length=100, unique=True)
    default_max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Output ceiling for requests that give none. Empty: such requests are refused.",
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
    # A change of timezone or billing day takes effect at the end of the monthly period it was
    # made in (see ``windows.tenant_period``); until then the previous calendar applies.
    previous_timezone = models.CharField(max_length=64, blank=True, default="")
    previous_billing_day = models.PositiveSmallIntegerField(null=True, blank=True)
    calendar_effective_from = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the current timezone and billing day took or take effect; empty: always.",
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
