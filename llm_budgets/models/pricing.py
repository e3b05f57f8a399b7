"""Versioned prices per (provider, model)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class PriceSource(models.TextChoices):
    MANUAL = "manual", "Manual"
    IMPORTED = "imported", "Imported"


class Price(models.Model):
    """A versioned price for (provider, model), per million tokens. Never edited once used."""

    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    input_per_mtok = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    cached_input_per_mtok = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Empty: cached input costs as input.",
    )
    cache_write_per_mtok = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Empty: cache writes cost as input.",
    )
    output_per_mtok = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    per_request = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0
    )
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
