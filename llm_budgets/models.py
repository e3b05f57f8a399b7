"""The ledger's tables. Only the services (admission, settlement, limits, pricing) write them.

Invariants that a database can hold are constraints here: non-negative amounts, one counter per
(budget, period), one tenant per external id, one charge line per reservation, one reservation per
(tenant, idempotency key).
"""

from __future__ import annotations

import uuid
import zoneinfo

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


def _money(**kwargs: object) -> models.DecimalField:
    return models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, **kwargs)  # type: ignore[arg-type]


def _validate_timezone(value: str) -> None:
    from django.core.exceptions import ValidationError

    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(
            f"{value!r} is not an IANA time zone such as 'Europe/Amsterdam'."
        ) from exc


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
    timezone = models.CharField(max_length=64, default="UTC", validators=[_validate_timezone])
    billing_day = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(31)],
        help_text="Day of month the monthly period starts (clamped to the month's last day).",
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


class Scope(models.TextChoices):
    GLOBAL = "global", "Global"
    TENANT = "tenant", "Tenant"
    END_USER_DEFAULT = "end_user_default", "Each end user of a tenant"
    END_USER = "end_user", "One end user"


class Window(models.TextChoices):
    MONTH = "month", "Month"
    DAY = "day", "Day"
    HOUR = "hour", "Hour"
    LIFETIME = "lifetime", "Lifetime"


class Budget(models.Model):
    """One enforceable cap: a scope, a window and a limit."""

    scope = models.CharField(max_length=20, choices=Scope.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    window = models.CharField(max_length=20, choices=Window.choices)
    limit = _money()
    currency = models.CharField(max_length=3, default="USD")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope", "tenant_id", "end_user_id", "window"]
        constraints = [
            models.CheckConstraint(
                condition=Q(limit__gte=0), name="llmb_budget_limit_non_negative"
            ),
            models.CheckConstraint(
                condition=(
                    Q(scope=Scope.GLOBAL, tenant__isnull=True, end_user__isnull=True)
                    | Q(scope=Scope.TENANT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.END_USER_DEFAULT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.END_USER, tenant__isnull=False, end_user__isnull=False)
                ),
                name="llmb_budget_scope_matches_owner",
            ),
            models.UniqueConstraint(
                fields=["window"],
                condition=Q(scope=Scope.GLOBAL),
                name="llmb_budget_one_global_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "window"],
                condition=Q(scope=Scope.TENANT),
                name="llmb_budget_one_tenant_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "window"],
                condition=Q(scope=Scope.END_USER_DEFAULT),
                name="llmb_budget_one_user_default_per_window",
            ),
            models.UniqueConstraint(
                fields=["end_user", "window"],
                condition=Q(scope=Scope.END_USER),
                name="llmb_budget_one_end_user_per_window",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope_label} {self.window} {self.limit} {self.currency}"

    @property
    def scope_label(self) -> str:
        """The scope as a person reads it: ``global``, ``tenant acme``, ``end user acme/u-1``."""
        if self.scope == Scope.GLOBAL:
            return "global"
        if self.scope == Scope.TENANT:
            return f"tenant {self.tenant.external_id}"  # type: ignore[union-attr]
        if self.scope == Scope.END_USER_DEFAULT:
            return f"end user {self.tenant.external_id}/*"  # type: ignore[union-attr]
        return f"end user {self.tenant.external_id}/{self.end_user.external_id}"  # type: ignore[union-attr]


class Counter(models.Model):
    """``(budget, period_start) -> spent, reserved``: the only rows admission locks."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="counters")
    period_start = models.DateTimeField()
    spent = _money(default=0)
    reserved = _money(default=0)

    class Meta:
        ordering = ["budget_id", "-period_start"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start"], name="llmb_counter_one_per_period"
            ),
            models.CheckConstraint(
                condition=Q(spent__gte=0), name="llmb_counter_spent_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(reserved__gte=0), name="llmb_counter_reserved_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.budget} from {self.period_start:%Y-%m-%d %H:%M}"


class PriceSource(models.TextChoices):
    MANUAL = "manual", "Manual"
    IMPORTED = "imported", "Imported"


class Price(models.Model):
    """A versioned price for (provider, model), per million tokens. Never edited once used."""

    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    input_per_mtok = _money()
    cached_input_per_mtok = _money(
        null=True, blank=True, help_text="Empty: cached input costs as input."
    )
    cache_write_per_mtok = _money(
        null=True, blank=True, help_text="Empty: cache writes cost as input."
    )
    output_per_mtok = _money()
    per_request = _money(default=0)
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True)
    source = models.CharField(
        max_length=10, choices=PriceSource.choices, default=PriceSource.MANUAL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["provider", "model", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "model", "effective_from"],
                name="llmb_price_one_version_per_start",
            ),
            models.CheckConstraint(
                condition=Q(input_per_mtok__gte=0, output_per_mtok__gte=0, per_request__gte=0)
                & (Q(cached_input_per_mtok__isnull=True) | Q(cached_input_per_mtok__gte=0))
                & (Q(cache_write_per_mtok__isnull=True) | Q(cache_write_per_mtok__gte=0)),
                name="llmb_price_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True)
                | Q(effective_to__gt=models.F("effective_from")),
                name="llmb_price_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} from {self.effective_from:%Y-%m-%d}"


class ReservationState(models.TextChoices):
    HELD = "held", "Held"
    COMMITTED = "committed", "Committed"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"


class Reservation(models.Model):
    """A durable hold of a call's worst-case cost on every counter that applies."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="reservations")
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    price = models.ForeignKey(Price, on_delete=models.PROTECT, related_name="reservations")
    input_tokens = models.PositiveIntegerField()
    max_output_tokens = models.PositiveIntegerField()
    amount = _money()
    currency = models.CharField(max_length=3, default="USD")
    state = models.CharField(
        max_length=10,
        choices=ReservationState.choices,
        default=ReservationState.HELD,
        db_index=True,
    )
    # NULL, not "": the unique constraint applies only to calls that gave a key.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    counters = models.ManyToManyField(
        Counter, through="ReservationHold", related_name="reservations"
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="llmb_reservation_idempotency_per_tenant",
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=0), name="llmb_reservation_amount_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("created_at")),
                name="llmb_reservation_expires_after_start",
            ),
        ]
        indexes = [models.Index(fields=["state", "expires_at"], name="llmb_reservation_due")]

    def __str__(self) -> str:
        return f"{self.id} {self.provider}/{self.model} {self.amount} ({self.state})"


class ReservationHold(models.Model):
    """Which counters a reservation holds its amount on (the same amount on each)."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="holds")
    counter = models.ForeignKey(Counter, on_delete=models.PROTECT, related_name="holds")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "counter"], name="llmb_hold_once_per_counter"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reservation_id} on counter {self.counter_id}"


class UsageKind(models.TextChoices):
    CHARGE = "charge", "Charge"
    TRUE_UP = "true_up", "True-up of an estimated charge"


class UsageRecord(models.Model):
    """An immutable ledger line. A counter's ``spent`` is the sum of the lines of its reservations.

    A reservation has at most one ``charge`` line; a late commit after an estimated expiry adds
    one ``true_up`` line with the difference (possibly negative).
    """

    reservation = models.ForeignKey(
        Reservation, on_delete=models.PROTECT, related_name="usage_records"
    )
    kind = models.CharField(max_length=10, choices=UsageKind.choices, default=UsageKind.CHARGE)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.PROTECT, related_name="usage_records"
    )
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    price = models.ForeignKey(Price, on_delete=models.PROTECT, related_name="usage_records")
    input_tokens = models.PositiveIntegerField(default=0)
    cached_input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost = _money()
    currency = models.CharField(max_length=3, default="USD")
    overage = _money(default=0, help_text="Cost above the hold (actual - reserved), when positive.")
    is_estimated = models.BooleanField(
        default=False,
        help_text="Charged from the hold (expired or uncertain), not from reported usage.",
    )
    period_start = models.DateTimeField(
        help_text="When the reservation was made; its period is charged."
    )
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "kind"], name="llmb_usage_one_line_per_kind"
            ),
            models.CheckConstraint(
                condition=Q(kind=UsageKind.TRUE_UP) | Q(cost__gte=0),
                name="llmb_usage_charge_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(overage__gte=0), name="llmb_usage_overage_non_negative"
            ),
        ]
        indexes = [models.Index(fields=["tenant", "created_at"], name="llmb_usage_tenant_time")]

    def __str__(self) -> str:
        return f"{self.kind} {self.cost} {self.currency} for {self.reservation_id}"


class AuditEvent(models.Model):
    """Who changed what, when and why. Append-only."""

    action = models.CharField(max_length=64)
    actor = models.CharField(
        max_length=255, blank=True, help_text="Username, or the code path that acted."
    )
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.CharField(max_length=255, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.action} {self.target}"
