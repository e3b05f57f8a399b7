"""Prices: which version is in effect, the worst case of a request, the cost of actual usage.

Usage convention (OpenAI's, also genai-prices'): ``input_tokens`` counts all input tokens,
cached ones included; ``cached_input_tokens`` says how many of those were cache reads.
``output_tokens`` includes reasoning tokens.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage, UnknownPrice
from llm_budgets.models import AuditEvent, Price, PriceSource
from llm_budgets.money import MILLION, round_charge, round_hold


def price_in_effect(*, provider: str | None, model: str, at: datetime) -> Price:
    """The newest version that has started by ``at`` and not ended; ``UnknownPrice`` if none.

    Without a provider, the model must be priced by exactly one provider.
    """
    versions = Price.objects.filter(model=model, effective_from__lte=at).filter(
        Q(effective_to__isnull=True) | Q(effective_to__gt=at)
    )
    if provider is not None:
        versions = versions.filter(provider=provider)
    else:
        providers = sorted(set(versions.values_list("provider", flat=True)))
        if len(providers) > 1:
            raise InvalidUsage(
                f"{model} is priced by several providers ({', '.join(providers)}): "
                "pass provider= to say which one serves the call.",
                field="provider",
            )
    price = versions.order_by("-effective_from").first()
    if price is None:
        raise UnknownPrice(provider=provider, model=model)
    return price


def worst_case(price: Price, *, input_tokens: int, max_output_tokens: int) -> Decimal:
    """The most a request can cost: every input token uncached, every output token used."""
    raw = (
        Decimal(input_tokens) * price.input_per_mtok
        + Decimal(max_output_tokens) * price.output_per_mtok
    ) / MILLION + price.per_request
    return round_hold(raw)


def actual_cost(
    price: Price, *, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0
) -> Decimal:
    """What reported usage costs at ``price``."""
    if cached_input_tokens > input_tokens:
        raise InvalidUsage(
            f"cached_input_tokens ({cached_input_tokens}) cannot exceed input_tokens "
            f"({input_tokens}): input_tokens counts cached tokens too.",
            field="cached_input_tokens",
        )
    cached_rate = (
        price.cached_input_per_mtok
        if price.cached_input_per_mtok is not None
        else price.input_per_mtok
    )
    raw = (
        Decimal(input_tokens - cached_input_tokens) * price.input_per_mtok
        + Decimal(cached_input_tokens) * cached_rate
        + Decimal(output_tokens) * price.output_per_mtok
    ) / MILLION + price.per_request
    return round_charge(raw)


def price_set(
    *,
    provider: str,
    model: str,
    input_per_mtok: object,
    output_per_mtok: object,
    cached_input_per_mtok: object = None,
    cache_write_per_mtok: object = None,
    per_request: object = 0,
    effective_from: datetime | None = None,
    source: str = PriceSource.MANUAL,
    actor: str = "",
) -> Price:
    """Add a price version. Existing versions are never edited; the newest started one wins."""
    validation.identifier("provider", provider, max_length=64)
    validation.identifier("model", model, max_length=128)
    if effective_from is not None and timezone.is_naive(effective_from):
        raise InvalidUsage("effective_from must be timezone-aware.", field="effective_from")
    starts = effective_from or timezone.now()
    values = dict(
        provider=provider,
        model=model,
        input_per_mtok=validation.money("input_per_mtok", input_per_mtok),
        output_per_mtok=validation.money("output_per_mtok", output_per_mtok),
        cached_input_per_mtok=validation.optional_money(
            "cached_input_per_mtok", cached_input_per_mtok
        ),
        cache_write_per_mtok=validation.optional_money(
            "cache_write_per_mtok", cache_write_per_mtok
        ),
        per_request=validation.money("per_request", per_request),
        currency=conf.CURRENCY,
        effective_from=starts,
        source=source,
    )
    with transaction.atomic():
        if Price.objects.filter(provider=provider, model=model, effective_from=starts).exists():
            raise InvalidUsage(
                f"{provider}/{model} already has a version starting at "
                f"{starts.isoformat()}; versions are never edited, "
                "give the new one a later effective_from.",
                field="effective_from",
            )
        price = Price.objects.create(**values)
        _audit_price(price, actor)
    return price


def _audit_price(price: Price, actor: str) -> None:
    AuditEvent.objects.create(
        action="price.set",
        actor=actor,
        target=f"price {price.provider}/{price.model}",
        after={
            "id": price.pk,
            "input_per_mtok": str(price.input_per_mtok),
            "output_per_mtok": str(price.output_per_mtok),
            "effective_from": price.effective_from.isoformat(),
        },
    )
