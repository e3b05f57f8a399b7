"""Plans, tenants and their end users."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from llm_budgets.models.fields import (
    split_emails,
    validate_thresholds,
    validate_timezone,
)
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class UnknownModelPolicy(models.TextChoices):
    REFUSE = "refuse", "Refuse the call"
    RESERVE_FIXED = "reserve_fixed", "Hold and charge a fixed amount per request"
    PRICE_AS = "price_as", "Price it as another model"


MARKUP_DIGITS, MARKUP_PLACES = 7, 3


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
    warn_projected = models.BooleanField(
        default=False,
        help_text="Also warn, once per period, when a monthly budget is projected to exceed its "
        "limit before it resets (reads.projections), through the same emails as thresholds.",
    )
    unknown_model_policy = models.CharField(
        max_length=20, choices=UnknownModelPolicy.choices, default=UnknownModelPolicy.REFUSE
    )
    unknown_model_fixed_amount = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="reserve_fixed: the amount held and charged per request.",
    )
    unknown_model_price_as_provider = models.CharField(max_length=64, blank=True)
    unknown_model_price_as_model = models.CharField(
        max_length=128, blank=True, help_text="price_as: the model whose price is used."
    )
    markup_percent = models.DecimalField(
        max_digits=MARKUP_DIGITS,
        decimal_places=MARKUP_PLACES,
        default=0,
        help_text="Customer price = provider cost x (1 + markup/100).",
    )
    degradation_ladder = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "Rungs applied at admission to requests that pass allow_degrade=True, e.g. "
            '[{"at_percent": 80, "models": {"gpt-4o": "gpt-4o-mini"}}, '
            '{"at_percent": 95, "max_output_tokens": 256}]. Empty: never degrade.'
        ),
    )
    # Automatic kill switches (llm_budgets.jobs.anomalies). Empty: that detector is off.
    anomaly_window_minutes = models.PositiveIntegerField(
        default=10, help_text="Window of the spend-velocity and failure-storm detectors."
    )
    anomaly_tenant_spend = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Trip a tenant that spends more than this within the window.",
    )
    anomaly_end_user_spend = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Trip an end user who spends more than this within the window.",
    )
    anomaly_reservations_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Runaway loop: trip an end user with more reservations than this in a minute.",
    )
    anomaly_failure_share = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Failure storm: trip a tenant whose share of released or expired holds in the "
        "window is above this (0 to 1).",
    )
    anomaly_failure_min_holds = models.PositiveIntegerField(
        default=20, help_text="A failure storm needs at least this many settled holds."
    )
    anomaly_auto_clear_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Automatic trips clear themselves after this long. Empty: only a person clears.",
    )
    # Self-serve (docs/pages.md, "Tenant admins act"): off unless an operator turns it on, since
    # a tenant changing its own caps moves money; a tenant may override either field.
    self_serve = models.BooleanField(
        default=False,
        help_text="Tenant admins may manage their own users' budgets, raises, API keys and "
        "alerts from the usage pages and with a self-serve API key.",
    )
    self_serve_ceiling = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="The most a tenant admin may set any one budget to (raises included). Empty: "
        "no self-serve budget can be set until a ceiling is given here or on the tenant.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(markup_percent__gte=-100), name="llmb_plan_markup_above_minus_100"
            ),
            models.CheckConstraint(
                condition=~Q(unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED)
                | Q(unknown_model_fixed_amount__gt=0),
                name="llmb_plan_fixed_policy_has_amount",
            ),
            models.CheckConstraint(
                condition=~Q(unknown_model_policy=UnknownModelPolicy.PRICE_AS)
                | (~Q(unknown_model_price_as_provider="") & ~Q(unknown_model_price_as_model="")),
                name="llmb_plan_price_as_names_model",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from llm_budgets.degradation import ladder_parse
        from llm_budgets.exceptions import InvalidUsage

        try:
            ladder_parse(self.degradation_ladder)
        except InvalidUsage as exc:
            raise ValidationError({"degradation_ladder": exc.message}) from None


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
    markup_percent = models.DecimalField(
        max_digits=MARKUP_DIGITS,
        decimal_places=MARKUP_PLACES,
        null=True,
        blank=True,
        help_text="Overrides the plan's markup. Empty: the plan's.",
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
    self_serve = models.BooleanField(
        null=True,
        blank=True,
        help_text="Overrides the plan's self-serve switch. Empty: the plan's (off without a plan).",
    )
    self_serve_ceiling = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Overrides the plan's self-serve ceiling. Empty: the plan's.",
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
    def billing_emails(self) -> str:
        """The billing contacts (who receive budget warnings), as ``ensure_tenant`` sets them:
        the addresses of the tenant's billing-contacts email endpoint (docs/alerts.md)."""
        endpoint = self.alert_endpoints.filter(billing_contacts=True).first()
        return endpoint.target if endpoint is not None else ""

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
        # The cap on new end users per tenant and day counts by it (engine.first_sight).
        indexes = [models.Index(fields=["tenant", "created_at"], name="llmb_enduser_tenant_new")]

    def __str__(self) -> str:
        return f"{self.tenant.external_id}/{self.external_id}"
