"""Daily usage rollups: what usage pages and reports read instead of scanning the ledger."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets import clock, money
from llm_budgets.models.tenancy import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class DailyUsage(models.Model):
    """Totals of a tenant's ledger lines for one local day (tenant's timezone), end user and model.

    Lines are bucketed by the reservation's time (``UsageRecord.reserved_at``), like counters,
    so a month of rollups adds up to the month's counter. Derived data, rebuilt from the ledger.
    """

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="daily_usage")
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.CASCADE, related_name="daily_usage"
    )
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    calls = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0)
    customer_cost = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        default=0,
        help_text="The cost at customer price (with the tenant's markup).",
    )
    estimated_cost = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        default=0,
        help_text="Part of the cost charged from holds.",
    )
    currency = models.CharField(max_length=3, default="USD")
    updated_at = models.DateTimeField()
    through_id = models.BigIntegerField(
        default=0,
        help_text="The rollup's watermark when this row was written: it sums the ledger lines of "
        "its key with an id up to this one (``RollupWatermark``).",
    )

    class Meta:
        ordering = ["-day", "tenant_id", "provider", "model"]
        constraints = [
            # Two partial constraints: NULL end users would otherwise never collide.
            models.UniqueConstraint(
                fields=["day", "tenant", "end_user", "provider", "model"],
                condition=Q(end_user__isnull=False),
                name="llmb_daily_one_per_user_model",
            ),
            models.UniqueConstraint(
                fields=["day", "tenant", "provider", "model"],
                condition=Q(end_user__isnull=True),
                name="llmb_daily_one_per_tenant_model",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "day"], name="llmb_daily_tenant_day"),
            # A member's own usage on the tenant pages: one end user's days.
            models.Index(fields=["end_user", "day"], name="llmb_daily_end_user_day"),
        ]

    def __str__(self) -> str:
        cost = money.money(self.cost, self.currency)
        return f"{clock.day(self.day)} {self.tenant_id} {self.provider}/{self.model}: {cost}"


class TenantDailyUsage(models.Model):
    """``DailyUsage`` summed over end users: one row per local day, tenant and model.

    Written by the same rebuild, in the same transaction, from the same totals: the tenant pages'
    charts by day and by model read a few hundred of these instead of every end user's rows.
    """

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tenant_daily_usage")
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    calls = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0)
    customer_cost = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0
    )
    estimated_cost = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0
    )
    currency = models.CharField(max_length=3, default="USD")
    updated_at = models.DateTimeField()
    through_id = models.BigIntegerField(
        default=0,
        help_text="The rollup's watermark when this row was written: it sums the ledger lines of "
        "its key with an id up to this one (``RollupWatermark``).",
    )

    class Meta:
        ordering = ["-day", "tenant_id", "provider", "model"]
        verbose_name_plural = "tenant daily usage"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "day", "provider", "model"],
                name="llmb_tenant_daily_one_per_model",
            ),
        ]

    def __str__(self) -> str:
        cost = money.money(self.cost, self.currency)
        return f"{clock.day(self.day)} {self.tenant_id} {self.provider}/{self.model}: {cost}"


class RollupWatermark(models.Model):
    """How far the daily rollups have read the ledger (one row, ``pk=1``).

    Every rollup row sums exactly the ledger lines of its key with ``id <= through_id`` (the
    watermark of the rebuild that wrote it), and a rebuild rewrites every day a line above the
    previous watermark belongs to, in the same transaction as it moves the watermark. So the
    lines a read must add to the rollups are those above the watermark, plus ``gaps``: ids below
    it that were not yet committed when it was taken (a settlement still in flight on
    PostgreSQL), each with when it was first seen (``jobs.rollups``; docs/pages.md).
    """

    through_id = models.BigIntegerField(default=0)
    gaps = models.JSONField(
        default=list,
        blank=True,
        help_text="[[id, first seen (ISO time)], ...]: ids at or below the watermark that no "
        "rollup has read yet.",
    )
    updated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"rollups through ledger line {self.through_id}"

    @property
    def gap_ids(self) -> frozenset[int]:
        return frozenset(int(gap[0]) for gap in self.gaps or ())
