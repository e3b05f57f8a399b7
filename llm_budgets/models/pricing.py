"""Versioned prices per (provider, model)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets import clock
from llm_budgets.money import RATE_DECIMAL_PLACES, RATE_MAX_DIGITS


class PriceSource(models.TextChoices):
    MANUAL = "manual", "Manual"
    IMPORTED = "imported", "Imported"


class PricingBasis(models.TextChoices):
    """Where a hold or a charge got its amount: a price, or the plan's unknown-model policy."""

    PRICE = "price", "Price of the model"
    PRICE_AS = "price_as", "Policy: priced as another model"
    FIXED = "fixed", "Policy: fixed amount per request"


class Price(models.Model):
    """A versioned price for (provider, model), per million tokens. Never edited once used."""

    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    input_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS, decimal_places=RATE_DECIMAL_PLACES
    )
    cached_input_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS,
        decimal_places=RATE_DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Empty: cached input costs as input.",
    )
    cache_write_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS,
        decimal_places=RATE_DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Empty: cache writes cost as input.",
    )
    cache_write_1h_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS,
        decimal_places=RATE_DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="1-hour cache writes. Empty: priced as cache writes.",
    )
    output_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS, decimal_places=RATE_DECIMAL_PLACES
    )
    reasoning_per_mtok = models.DecimalField(
        max_digits=RATE_MAX_DIGITS,
        decimal_places=RATE_DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="Empty: reasoning tokens cost as output.",
    )
    per_request = models.DecimalField(
        max_digits=RATE_MAX_DIGITS, decimal_places=RATE_DECIMAL_PLACES, default=0
    )
    tool_fees = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-call fee of named server-side tools, e.g. {"web_search": "0.01"}.',
    )
    tiers = models.JSONField(
        default=list,
        blank=True,
        help_text='Higher rates above a prompt size: [{"above_input_tokens": 200000, '
        '"prices": {"input_per_mtok": "6", ...}}], ascending.',
    )
    service_tiers = models.JSONField(
        default=dict,
        blank=True,
        help_text='Rates of calls served at a premium tier: {"priority": {"input_per_mtok": '
        '"4.25", "output_per_mtok": "17"}}; they replace the version\'s own. A call asking for a '
        "tier not listed is refused.",
    )
    daily_spans = models.JSONField(
        default=list,
        blank=True,
        help_text='Time-of-day rates (UTC): [{"start": "16:30", "end": "00:30", '
        '"prices": {...}}]; the first span containing the time wins.',
    )
    max_output_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="The model's output maximum; output ceilings clamp to it."
    )
    context_window = models.PositiveIntegerField(
        null=True, blank=True, help_text="Input plus output maximum; bounds the output ceiling."
    )
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True)
    source = models.CharField(
        max_length=10, choices=PriceSource.choices, default=PriceSource.MANUAL
    )
    source_detail = models.CharField(
        max_length=255, blank=True, help_text="Where an imported price came from."
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
                & (Q(cache_write_per_mtok__isnull=True) | Q(cache_write_per_mtok__gte=0))
                & (Q(cache_write_1h_per_mtok__isnull=True) | Q(cache_write_1h_per_mtok__gte=0))
                & (Q(reasoning_per_mtok__isnull=True) | Q(reasoning_per_mtok__gte=0)),
                name="llmb_price_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True)
                | Q(effective_to__gt=models.F("effective_from")),
                name="llmb_price_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} from {clock.when(self.effective_from, None)}"


class ModelAlias(models.Model):
    """A spelling of a model name that resolves to a priced model, set by staff for names that
    neither an exact price nor genai-prices' matching rules recognise (e.g. a fine-tune's id or
    a gateway's own names). Changes are audited."""

    pattern = models.CharField(
        max_length=128,
        help_text="The name as sent, or a pattern with * (any characters), e.g. ft:gpt-4o:acme:*.",
    )
    provider = models.CharField(
        max_length=64, blank=True, help_text="Only for this provider's calls. Empty: any provider."
    )
    model = models.CharField(max_length=128, help_text="The priced model whose price applies.")
    note = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "model aliases"
        ordering = ["provider", "pattern"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "pattern"], name="llmb_model_alias_once_per_provider"
            ),
        ]

    def __str__(self) -> str:
        where = f"{self.provider}/" if self.provider else ""
        return f"{where}{self.pattern} -> {self.model}"
