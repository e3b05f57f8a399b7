"""Reservations, the counters they hold, and the immutable ledger lines."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models
from django.db.models import Q

from llm_budgets import money
from llm_budgets.models.budgets import BudgetUnit, Counter
from llm_budgets.models.pricing import Price, PricingBasis
from llm_budgets.models.tenancy import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class ReservationState(models.TextChoices):
    HELD = "held", "Held"
    COMMITTED = "committed", "Committed"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    # The call's outcome is unknown (timeout, lost worker): the hold stays counted until real
    # usage arrives or the reconcile job settles it by rule (see settlement.reservations_reconcile).
    UNCERTAIN = "uncertain", "Uncertain"


# States whose amount is still counted in its counters' ``reserved``.
LIVE_STATES = (ReservationState.HELD, ReservationState.UNCERTAIN)


class Reservation(models.Model):
    """A durable hold of a call's worst-case cost on every counter that applies."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="reservations")
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    # NULL only under the reserve_fixed unknown-model policy.
    run = models.ForeignKey(
        "llm_budgets.Run",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="reservations",
        help_text="The run the call named, if any.",
    )
    price = models.ForeignKey(
        Price, null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    pricing_basis = models.CharField(
        max_length=10, choices=PricingBasis.choices, default=PricingBasis.PRICE
    )
    input_tokens = models.PositiveIntegerField()
    max_output_tokens = models.PositiveIntegerField()
    max_tool_calls = models.JSONField(
        null=True,
        blank=True,
        help_text="The server-side tool calls the hold priced ({name: calls}); NULL on holds "
        "taken before it was recorded (their commits are not checked for tool calls).",
    )
    amount = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, help_text="The hold at provider cost."
    )
    markup_percent = models.DecimalField(max_digits=7, decimal_places=3, default=0)
    customer_amount = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        default=0,
        help_text="The hold at customer price.",
    )
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
    requested_model = models.CharField(
        max_length=128, blank=True, help_text="The model asked for, when another was granted."
    )
    degraded = models.BooleanField(
        default=False, help_text="Granted a cheaper model or a lower output ceiling."
    )
    tags = models.JSONField(
        default=dict, blank=True, help_text="The caller's string tags, copied onto ledger lines."
    )
    service_tier = models.CharField(
        max_length=32, blank=True, default="", help_text="Empty: the standard tier."
    )
    created_at = models.DateTimeField()
    # No index of its own: every query on it also filters on state, which ``llmb_reservation_due``
    # (state, expires_at) serves. An index on expires_at alone let PostgreSQL walk the expired
    # rows (still live, still in that index) on every sweep batch: quadratic in a big sweep.
    expires_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    uncertain_at = models.DateTimeField(
        null=True, blank=True, help_text="When the call's outcome was marked unknown."
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="llmb_reservation_idempotency_per_tenant",
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=0, customer_amount__gte=0),
                name="llmb_reservation_amount_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("created_at")),
                name="llmb_reservation_expires_after_start",
            ),
        ]
        indexes = [models.Index(fields=["state", "expires_at"], name="llmb_reservation_due")]

    def __str__(self) -> str:
        held = money.money(self.amount, self.currency)
        return f"{self.id} {self.provider}/{self.model} {held} ({self.state})"

    def amount_for(self, unit: str) -> Decimal:
        """The hold in a budget's unit: provider cost, or customer price."""
        return self.customer_amount if unit == BudgetUnit.CUSTOMER_PRICE else self.amount

    # Not stored: of amount and customer_amount, the input tolerance's part, set by admission
    # from the estimate it holds (pricing.estimates.Estimate) so that a refusal can say it.
    input_tolerance = Decimal(0)
    customer_input_tolerance = Decimal(0)

    def input_tolerance_for(self, unit: str) -> Decimal:
        """Of :meth:`amount_for`, the input tolerance's part (0 on a reservation read back)."""
        if unit == BudgetUnit.CUSTOMER_PRICE:
            return self.customer_input_tolerance
        return self.input_tolerance


class ReservationHold(models.Model):
    """Which counters a reservation holds on; ``unit`` (the budget's, when the hold was taken)
    says which of its amounts each holds and is charged: provider cost or customer price."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="holds")
    counter = models.ForeignKey(Counter, on_delete=models.PROTECT, related_name="holds")
    unit = models.CharField(
        max_length=20, choices=BudgetUnit.choices, default=BudgetUnit.PROVIDER_COST
    )

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
    ADJUSTMENT = "adjustment", "Compensating adjustment by staff"


class UsageRecordQuerySet(models.QuerySet["UsageRecord"]):
    def spend(self) -> UsageRecordQuerySet:
        """The lines that are what a tenant spent: charges, true-ups and voids (a void gives
        money back, and bills as a credit). Not a reset of one counter's spend (``counter``
        set): it gives a budget its allowance back and moves no money, so it counts on that
        counter alone (conservation), never in a total of spend. The one definition every
        tenant-facing total (rollups, pages, usage API, export) and billing use
        (docs/reliability.md, "One figure for what a tenant spent")."""
        return self.filter(counter__isnull=True)


class UsageRecord(models.Model):
    """An immutable ledger line. A counter's ``spent`` is the sum of the lines of its reservations.

    A reservation has at most one ``charge`` line; a late commit after an estimated expiry adds
    one ``true_up`` line with the difference (possibly negative).

    Staff corrections are ``adjustment`` lines, never edits or deletions: voiding a line adds one
    with the opposite cost on the same reservation (``voids`` names the line); resetting an end
    user's period adds one on that user's counter alone (``counter``, no reservation).
    """

    reservation = models.ForeignKey(
        Reservation,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
    )
    counter = models.ForeignKey(
        Counter,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="adjustments",
        help_text="Set only on an adjustment of one counter (a reset); it applies to it alone.",
    )
    voids = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="voided_by",
        help_text="The line this adjustment cancels.",
    )
    kind = models.CharField(max_length=10, choices=UsageKind.choices, default=UsageKind.CHARGE)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.PROTECT, related_name="usage_records"
    )
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    run = models.ForeignKey(
        "llm_budgets.Run",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
        help_text="The run the reservation named, if any.",
    )
    price = models.ForeignKey(
        Price, null=True, blank=True, on_delete=models.PROTECT, related_name="usage_records"
    )
    pricing_basis = models.CharField(
        max_length=10,
        choices=PricingBasis.choices,
        default=PricingBasis.PRICE,
        help_text="Whether the cost came from a price or from the unknown-model policy.",
    )
    input_tokens = models.PositiveIntegerField(default=0)
    cached_input_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    cache_write_1h_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    reasoning_tokens = models.PositiveIntegerField(default=0)
    tool_calls = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=dict, blank=True, help_text="The reservation's tags.")
    service_tier = models.CharField(
        max_length=32, blank=True, default="", help_text="The reservation's service tier."
    )
    cost = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, help_text="Provider cost."
    )
    customer_cost = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        default=0,
        help_text="Cost at the customer price (markup).",
    )
    currency = models.CharField(max_length=3, default="USD")
    overage = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        default=0,
        help_text="Cost above the hold (actual - reserved), when positive.",
    )
    is_estimated = models.BooleanField(
        default=False,
        help_text="Charged from the hold (expired or uncertain), not from reported usage.",
    )
    reserved_at = models.DateTimeField(
        help_text="When the reservation was made: the period it was made in is charged, and "
        "rollups and reports bucket the line by this time."
    )
    created_at = models.DateTimeField()

    objects = UsageRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("void_usagerecord", "Can void a ledger line (compensating entry)"),
            ("reset_spend", "Can reset an end user's period spend (compensating entry)"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["reservation", "kind"],
                condition=~Q(kind=UsageKind.ADJUSTMENT),
                name="llmb_usage_one_line_per_kind",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=[UsageKind.TRUE_UP, UsageKind.ADJUSTMENT])
                | Q(cost__gte=0, customer_cost__gte=0),
                name="llmb_usage_charge_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(kind=UsageKind.ADJUSTMENT)
                | Q(reservation__isnull=False, counter__isnull=True),
                name="llmb_usage_charge_has_reservation",
            ),
            models.CheckConstraint(
                condition=~Q(kind=UsageKind.ADJUSTMENT)
                | Q(reservation__isnull=False, counter__isnull=True)
                | Q(reservation__isnull=True, counter__isnull=False),
                name="llmb_usage_adjustment_has_one_target",
            ),
            models.CheckConstraint(
                condition=Q(overage__gte=0), name="llmb_usage_overage_non_negative"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="llmb_usage_tenant_time"),
            # Daily rollups read one day of a tenant's lines by the reservation's time.
            models.Index(fields=["tenant", "reserved_at"], name="llmb_usage_tenant_period"),
        ]

    def __str__(self) -> str:
        target = self.reservation_id or f"counter {self.counter_id}"
        return f"{self.kind} {money.money(self.cost, self.currency)} for {target}"

    @property
    def is_spend(self) -> bool:
        """Whether the line is spend (``UsageRecordQuerySet.spend``): not a counter's reset."""
        return self.counter_id is None

    def cost_for(self, unit: str) -> Decimal:
        """The line's amount in a budget's unit: provider cost, or customer price."""
        return self.customer_cost if unit == BudgetUnit.CUSTOMER_PRICE else self.cost
