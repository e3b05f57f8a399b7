"""Cross-check (issue 3 item 4): our imported tables price the same usage at the same moment as
``genai_prices.calc_price``, to the stored precision, for many models of many providers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from llm_budgets.models import Price
from llm_budgets.money import round_charge
from llm_budgets.pricing.costs import actual_cost
from llm_budgets.pricing.prices import price_in_effect
from llm_budgets.pricing.sync import prices_sync
from llm_budgets.usage import usage_validate

pytestmark = pytest.mark.django_db

PROVIDERS = ("anthropic", "openai", "google", "deepseek", "x-ai", "mistral", "groq")
# (input, cached reads, cache writes, of which 1-hour, output): small, cached, past a 200k tier.
USAGES = [
    (1_234, 0, 0, 0, 567),
    (50_000, 30_000, 10_000, 2_500, 4_321),
    (250_001, 120_000, 60_000, 0, 12_345),
]


def _moments(versions: list[Price]) -> list[datetime]:
    """A moment inside each version (after 2023, when these catalogues start), at an hour of peak
    and of off-peak time-of-day prices."""
    moments = []
    for version in versions:
        day = max(version.effective_from, datetime(2024, 1, 1, tzinfo=UTC))
        moments += [day + timedelta(hours=3, minutes=7), day + timedelta(hours=18, minutes=7)]
    return moments


def test_our_tables_agree_with_calc_price(no_network: list[object]) -> None:
    from genai_prices import Usage, calc_price

    for provider in PROVIDERS:
        prices_sync(provider=provider)
    models_checked: set[tuple[str, str]] = set()
    checks = 0
    mismatches = []
    pairs = sorted(set(Price.objects.values_list("provider", "model")))
    for provider, model in pairs:
        versions = list(Price.objects.filter(provider=provider, model=model))
        for at in _moments(versions):
            price = price_in_effect(provider=provider, model=model, at=at)
            for inp, reads, writes, writes_1h, out in USAGES:
                try:
                    theirs = calc_price(
                        Usage(
                            input_tokens=inp,
                            cache_read_tokens=reads,
                            cache_write_tokens=writes,
                            cache_write_1h_tokens=writes_1h,
                            output_tokens=out,
                        ),
                        model_ref=model,
                        provider_id=provider,
                        genai_request_timestamp=at,
                    )
                except (LookupError, ValueError):
                    continue  # genai-prices itself cannot price it (e.g. no cache support)
                if theirs.model.id != model:
                    continue  # its matcher resolved the name to another model
                usage = usage_validate(
                    input_tokens=inp,
                    output_tokens=out,
                    cached_input_tokens=reads,
                    cache_write_tokens=writes,
                    cache_write_1h_tokens=writes_1h,
                )
                ours = actual_cost(price, usage, at=at)
                checks += 1
                models_checked.add((provider, model))
                if ours != round_charge(theirs.total_price):
                    mismatches.append((provider, model, at, usage, ours, theirs.total_price))
    print(f"cross-checked {checks} prices of {len(models_checked)} models")
    assert not mismatches, mismatches[:5]
    assert len(models_checked) >= 50, len(models_checked)
    assert len({provider for provider, _ in models_checked}) >= 5
    assert checks >= 300, checks
