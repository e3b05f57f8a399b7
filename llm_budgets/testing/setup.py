"""Prices, tenants and budgets for a host's tests, in one call, through the app's services."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from llm_budgets import budgets
from llm_budgets.models import Price
from llm_budgets.results import BudgetResult, PriceResult, TenantResult

# In effect long before any date a test travels to (application_clock): a price is never
# missing because a test moved the clock back.
PRICES_FROM = datetime(2000, 1, 1, tzinfo=UTC)

# Per million tokens, the shapes the fake servers answer with (cache reads and writes, reasoning
# tokens, web search calls). Round numbers, so a host's assertions are easy to reason about.
PRICES: dict[tuple[str, str], dict[str, Any]] = {
    ("openai", "gpt-4o"): {
        "input_per_mtok": "2.50",
        "cached_input_per_mtok": "1.25",
        "output_per_mtok": "10.00",
        "tool_fees": {"web_search": "0.01"},
    },
    ("openai", "gpt-4o-mini"): {
        "input_per_mtok": "0.15",
        "cached_input_per_mtok": "0.075",
        "output_per_mtok": "0.60",
    },
    ("anthropic", "claude-sonnet-4-20250514"): {
        "input_per_mtok": "3.00",
        "cached_input_per_mtok": "0.30",
        "cache_write_per_mtok": "3.75",
        "cache_write_1h_per_mtok": "6.00",
        "output_per_mtok": "15.00",
        "tool_fees": {"web_search": "0.01"},
    },
}


@dataclass
class Seeded:
    """What :func:`setup_budgets` created or updated."""

    tenants: list[TenantResult] = field(default_factory=list)
    budgets: list[BudgetResult] = field(default_factory=list)
    prices: list[PriceResult] = field(default_factory=list)


def setup_budgets(
    tenants: str | Iterable[str] = ("acme",),
    *,
    limit: Decimal | int | str | None = "100",
    window: str = "month",
    each_user_limit: Decimal | int | str | None = None,
    each_user_window: str = "day",
    global_limit: Decimal | int | str | None = None,
    prices: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    prices_from: datetime = PRICES_FROM,
    **tenant_fields: Any,
) -> Seeded:
    """Price the models (``prices``, default :data:`PRICES`, in effect from ``prices_from``),
    create each tenant (external id; ``tenant_fields`` such as ``timezone``, ``billing_day``,
    ``plan`` go to ``budgets.ensure_tenant``) with a ``limit`` per ``window`` (None: no tenant
    budget) and, if given, an ``each_user_limit`` per ``each_user_window`` for each of its end
    users; ``global_limit`` caps the installation. Calling it again updates the limits and keeps
    the prices already in effect from ``prices_from``. Everything goes through the services."""
    seeded = Seeded()
    for (provider, model), fields in (PRICES if prices is None else prices).items():
        if Price.objects.filter(provider=provider, model=model, effective_from=prices_from):
            continue  # priced by an earlier call: versions are never edited
        seeded.prices.append(
            budgets.set_price(
                provider=provider, model=model, effective_from=prices_from, **dict(fields)
            )
        )
    if global_limit is not None:
        seeded.budgets.append(budgets.set_limit(amount=global_limit, window=window))
    for external_id in [tenants] if isinstance(tenants, str) else tenants:
        seeded.tenants.append(budgets.ensure_tenant(tenant=external_id, **tenant_fields))
        if limit is not None:
            budget = budgets.set_limit(tenant=external_id, amount=limit, window=window)
            seeded.budgets.append(budget)
        if each_user_limit is not None:
            seeded.budgets.append(
                budgets.set_limit(
                    tenant=external_id,
                    end_user="*",
                    amount=each_user_limit,
                    window=each_user_window,
                )
            )
    return seeded
