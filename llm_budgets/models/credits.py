"""Prepaid balances: a tenant's account, its credit lots and its Stripe top-ups.

A balance is a tenant budget with a lifetime window (``Budget.prepaid``) whose limit is the sum
of its live lots (``amount - forfeited``); ``billing/credits.py`` alone writes these rows.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Case, F, Q, Value, When

from llm_budgets.models.budgets import Budget
from llm_budgets.models.tenancy import Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS, display


def _money(**kwargs: object) -> models.DecimalField:
    return models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, **kwargs)  # type: ignore[arg-type]


class CreditAccount(models.Model):
    """A tenant's prepaid balance: its budget, where to top up, and its auto-recharge rule."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="credit_account")
    budget = models.OneToOneField(Budget, on_delete=models.PROTECT, related_name="credit_account")
    currency = models.CharField(max_length=3, default="USD")
    top_up_url = models.URLField(
        max_length=500, blank=True, help_text="Where a refusal tells the tenant to top up."
    )
    # Auto-recharge: when the balance falls below ``recharge_below``, charge ``recharge_amount``
    # off-session, at most ``recharge_daily_max`` in a UTC day. Empty: off.
    recharge_below = _money(null=True, blank=True)
    recharge_amount = _money(null=True, blank=True)
    recharge_daily_max = _money(null=True, blank=True)
    # Cleared by the transaction that crosses the threshold (which writes the recharge row), set
    # again when a top-up lifts the balance back above it: once per crossing.
    recharge_armed = models.BooleanField(default=True)
    payment_method_id = models.CharField(
        max_length=255, blank=True, help_text="The saved card auto-recharge charges off-session."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(recharge_below__isnull=True)
                | Q(recharge_below__gte=0, recharge_amount__gt=0),
                name="llmb_credit_account_recharge_complete",
            ),
        ]

    def __str__(self) -> str:
        return f"balance of {self.tenant.external_id} ({self.currency})"


class LotKind(models.TextChoices):
    PAID = "paid", "Paid"
    PROMOTIONAL = "promotional", "Promotional"


class LotSource(models.TextChoices):
    TOP_UP = "top_up", "Stripe top-up"
    RECHARGE = "recharge", "Auto-recharge"
    GRANT = "grant", "Grant by staff"
    ADJUSTMENT = "adjustment", "Adjustment by staff"


# The order of use reversed (``billing/credits.py``, ``order_of_use``): unexpired lots, paid
# ones, the latest-expiring (no expiry: the latest of all), the newest. A staff removal forfeits
# in this order; ``llmb_lot_last_used_first`` serves it on PostgreSQL, where DESC puts NULLs first.
LOT_UNEXPIRED = Case(When(expired_at__isnull=True, then=Value(1)), default=Value(0))
LOT_PAID = Case(When(kind=LotKind.PROMOTIONAL, then=Value(0)), default=Value(1))


class CreditLot(models.Model):
    """Credit added to a balance. Its live part, ``amount - forfeited``, counts in the limit;
    ``forfeited`` grows when it expires unspent, when staff remove it, and when its payment is
    refunded or disputed (``taken_back``, the part of ``forfeited`` a won dispute gives back)
    (billing/credits.py).

    Its Stripe mirror: ``stripe_grant_id`` is the live credit grant, of ``stripe_granted``;
    ``stripe_applied`` is what Stripe applied to invoices from the lot's earlier grants, voided
    when a take-back replaced them. In step: ``amount - forfeited == stripe_applied +
    stripe_granted`` (billing/topups.py keeps it, billing/credit_reconciliation.py checks it)."""

    account = models.ForeignKey(CreditAccount, on_delete=models.CASCADE, related_name="lots")
    kind = models.CharField(max_length=12, choices=LotKind.choices)
    source = models.CharField(max_length=12, choices=LotSource.choices)
    amount = _money()
    forfeited = _money(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    top_up = models.OneToOneField(
        "TopUp", null=True, blank=True, on_delete=models.PROTECT, related_name="lot"
    )
    taken_back = _money(default=0)
    stripe_grant_id = models.CharField(max_length=255, blank=True)
    stripe_granted = _money(default=0)
    stripe_applied = _money(default=0)
    # How many times the grant was replaced: the replacement's Idempotency-Key names it.
    stripe_generation = models.PositiveIntegerField(default=0)
    actor = models.CharField(max_length=255, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["account_id", "created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="llmb_lot_amount_positive"),
            models.CheckConstraint(
                condition=Q(forfeited__gte=0, forfeited__lte=F("amount")),
                name="llmb_lot_forfeited_in_range",
            ),
            models.CheckConstraint(
                condition=Q(taken_back__gte=0, taken_back__lte=F("forfeited")),
                name="llmb_lot_taken_back_in_range",
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False, expired_at__isnull=True),
                name="llmb_lot_to_expire",
            ),
            models.Index(
                F("account"),
                LOT_UNEXPIRED.desc(),
                LOT_PAID.desc(),
                F("expires_at").desc(),
                F("created_at").desc(),
                F("id").desc(),
                name="llmb_lot_last_used_first",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {display(self.amount)} for {self.account.tenant.external_id}"

    @property
    def live(self) -> object:
        return self.amount - self.forfeited


class DisputeStatus(models.TextChoices):
    NONE = "", "No dispute"
    OPEN = "open", "Open"  # the disputed amount is withdrawn from the payment
    WON = "won", "Won"  # the funds were reinstated
    LOST = "lost", "Lost"


class TopUpKind(models.TextChoices):
    CHECKOUT = "checkout", "Checkout"
    RECHARGE = "recharge", "Auto-recharge"


class TopUpState(models.TextChoices):
    PENDING = "pending", "Pending"  # checkout created / recharge queued, not paid yet
    CREDITED = "credited", "Credited"
    FAILED = "failed", "Payment failed"
    SKIPPED = "skipped", "Skipped (daily cap)"


class TopUp(models.Model):
    """A payment that raises a balance: a Checkout session, or an off-session auto-recharge
    (its row is the outbox the recharge job sends). Credited at most once: the payment intent is
    unique."""

    account = models.ForeignKey(CreditAccount, on_delete=models.CASCADE, related_name="top_ups")
    kind = models.CharField(max_length=10, choices=TopUpKind.choices)
    state = models.CharField(max_length=10, choices=TopUpState.choices, default=TopUpState.PENDING)
    amount = _money()
    currency = models.CharField(max_length=3, default="USD")
    package = models.CharField(max_length=64, blank=True)
    checkout_session_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    payment_intent_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    credited_by_event = models.CharField(max_length=255, blank=True)
    # Money gone back to the payer, each from its own Stripe figure: refunds (the charge's
    # cumulative ``amount_refunded``) and the charge's dispute (its ``amount`` while it is open
    # or lost; 0 once won). Their sum, at most ``amount``, is what the lot gives back.
    refunded = _money(default=0)
    disputed = _money(default=0)
    dispute_status = models.CharField(
        max_length=4, choices=DisputeStatus.choices, default=DisputeStatus.NONE, blank=True
    )
    # What went back that the lot no longer had to give (already expired or removed by staff):
    # not taken from the balance (docs/billing.md).
    unrecovered = _money(default=0)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    credited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="llmb_topup_amount_positive"),
            models.CheckConstraint(
                condition=Q(refunded__gte=0, refunded__lte=F("amount")),
                name="llmb_topup_refund_in_range",
            ),
        ]
        indexes = [
            models.Index(
                fields=["kind", "state"],
                condition=Q(state="pending"),
                name="llmb_topup_pending",
            )
        ]

    def __str__(self) -> str:
        return f"top-up {display(self.amount)} {self.currency} ({self.state})"
