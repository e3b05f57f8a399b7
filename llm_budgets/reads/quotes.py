"""A quote: the estimate of a request and the budgets it would draw on, without holding
anything (``reserve`` would hold what :func:`llm_budgets.pricing.estimates.request_estimate`
says)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.engine.applicable import scopes_for_read, shared_by_tenants
from llm_budgets.models import ApiKey, BudgetUnit, EndUser, PricingBasis
from llm_budgets.pricing.estimates import (
    Estimate,
    input_token_count,
    request_estimate,
)
from llm_budgets.pricing.model_names import ModelMatch
from llm_budgets.pricing.prices import price_match
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.results import BudgetStatus
from llm_budgets.tenancy.tenants import tenant_get
from llm_budgets.usage import tool_calls_validate


@dataclass(frozen=True)
class BudgetDraw:
    """A budget the request would draw on, and whether its hold would fit now."""

    status: BudgetStatus
    unit: str
    would_hold: Decimal
    fits: bool


@dataclass(frozen=True)
class Quote:
    provider: str | None
    model: str
    estimate: Estimate
    budgets: list[BudgetDraw]
    currency: str
    # Which rule of llm_budgets.pricing.model_names found the price (None: the unknown-model
    # policy).
    model_match: ModelMatch | None = None
    # Whether each budget ``for_tenant`` left out of ``budgets`` would fit.
    withheld_fits: tuple[bool, ...] = ()

    @property
    def admissible(self) -> bool:
        """Whether ``reserve`` would admit the request now (budgets can move meanwhile)."""
        fits = [draw.fits for draw in self.budgets] + list(self.withheld_fits)
        return bool(fits) and all(fits)

    def for_tenant(self) -> Quote:
        """The quote as a tenant's key may see it: budgets every tenant shares are left out
        (their figures are other tenants' spend), yet still decide ``admissible``."""
        shared = [draw for draw in self.budgets if shared_by_tenants(draw.status.scope)]
        return replace(
            self,
            budgets=[draw for draw in self.budgets if draw not in shared],
            withheld_fits=self.withheld_fits + tuple(draw.fits for draw in shared),
        )


def quote(
    *,
    tenant: str,
    model: str,
    provider: str | None = None,
    input_tokens: object = None,
    messages: object = None,
    prompt: object = None,
    max_output_tokens: object = None,
    end_user: str | None = None,
    ttl: int | None = None,
    max_tool_calls: object = None,
    run: object = None,
    tags: object = None,
    api_key: ApiKey | None = None,
    now: datetime | None = None,
) -> Quote:
    """The itemised worst case, the price version and the budgets a request would draw on.
    Reads only: nothing is held or created. ``run``, ``tags`` and ``api_key``: the budgets of
    the run, tags and key the call would name apply too."""
    if provider is not None:
        provider = validation.identifier("provider", provider, max_length=64)
    model = validation.identifier("model", model, max_length=128)
    tokens = input_token_count(
        provider=provider,
        model=model,
        input_tokens=input_tokens,
        messages=messages,
        prompt=prompt,
    )
    ceiling = (
        None
        if max_output_tokens is None
        else validation.token_count("max_output_tokens", max_output_tokens, allow_zero=False)
    )
    now = now or timezone.now()
    # In range before any timedelta is built: a huge ttl would overflow it (a 500, not a 400).
    ttl_seconds = conf.DEFAULT_TTL_SECONDS if ttl is None else validation.ttl_seconds("ttl", ttl)
    with ledger_guard("quote"):
        tenant_obj = tenant_get(tenant)
        estimate = request_estimate(
            tenant_obj,
            provider=provider,
            model=model,
            input_tokens=tokens,
            max_output_tokens=ceiling,
            start=now,
            end=now + timedelta(seconds=ttl_seconds),
            max_tool_calls=tool_calls_validate(max_tool_calls, field="max_tool_calls"),
        )
        user_obj = None
        if end_user is not None:
            user_obj = tenant_obj.end_users.filter(external_id=end_user).first() or EndUser(
                tenant=tenant_obj, external_id=end_user
            )
        draws = []
        scopes = scopes_for_read(tenant_obj, run=run, tags=tags, api_key=api_key)
        for status in budget_statuses(tenant_obj, user_obj, now, scopes):
            amount = (
                estimate.customer_amount
                if status.unit == BudgetUnit.CUSTOMER_PRICE
                else estimate.amount
            )
            draws.append(BudgetDraw(status, status.unit, amount, amount <= status.remaining))
    match = None
    if estimate.price is not None and estimate.pricing_basis == PricingBasis.PRICE:
        with ledger_guard("quote"):
            match = price_match(provider=provider, model=model, at=now)[1]
        provider = estimate.price.provider
    return Quote(provider, model, estimate, draws, conf.CURRENCY, match)
