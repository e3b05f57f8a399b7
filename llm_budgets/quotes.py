"""Estimating a request before it runs: the price (or policy) that applies, the output ceiling,
the itemised worst case at provider cost and at customer price. Admission holds what
:func:`request_estimate` says; :func:`quote` shows it, and the budgets it would draw on, without
holding anything."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.costs import Item, customer_hold, worst_case_items
from llm_budgets.engine.boundary import ledger_guard
from llm_budgets.exceptions import InvalidUsage, OutputCeilingRequired
from llm_budgets.model_names import ModelMatch
from llm_budgets.models import ApiKey, BudgetUnit, EndUser, Price, PricingBasis, Tenant
from llm_budgets.money import round_hold
from llm_budgets.pricing import output_ceiling, price_match, pricing_for_request
from llm_budgets.selectors import (
    BudgetStatus,
    budget_statuses,
    scopes_for_read,
    shared_by_tenants,
)
from llm_budgets.tenants import tenant_get
from llm_budgets.tokens import count_input_tokens
from llm_budgets.usage import tool_calls_validate


@dataclass(frozen=True)
class Estimate:
    price: Price | None  # None: the plan's fixed amount (reserve_fixed policy)
    pricing_basis: str
    input_tokens: int
    max_output_tokens: int
    items: list[Item]
    amount: Decimal  # the hold at provider cost
    markup_percent: Decimal
    customer_amount: Decimal  # the hold at customer price


def tenant_markup(tenant: Tenant) -> Decimal:
    """The tenant's markup percent: its own override, else its plan's, else none."""
    if tenant.markup_percent is not None:
        return tenant.markup_percent
    return tenant.plan.markup_percent if tenant.plan else Decimal(0)


def input_token_count(
    *, provider: str | None, model: str, input_tokens: object, messages: object, prompt: object
) -> int:
    """``input_tokens`` as given, or counted from ``messages`` / ``prompt``."""
    if input_tokens is not None:
        if messages is not None or prompt is not None:
            raise InvalidUsage(
                "give input_tokens, or messages / prompt to count, not both.", field="input_tokens"
            )
        return validation.token_count("input_tokens", input_tokens)
    if messages is None and prompt is None:
        return validation.token_count("input_tokens", None)  # raises, naming the field
    return count_input_tokens(provider=provider, model=model, messages=messages, prompt=prompt)


def service_tier_validate(value: object) -> str:
    """A service tier name (``""`` or None: the standard tier)."""
    if value is None or value == "":
        return ""
    return validation.identifier("service_tier", value, max_length=32)


def request_estimate(
    tenant: Tenant,
    *,
    provider: str | None,
    model: str,
    input_tokens: int,
    max_output_tokens: int | None,
    start: datetime,
    end: datetime,
    max_tool_calls: dict[str, int] | None = None,
    in_effect: Price | None = None,
    service_tier: str = "",
) -> Estimate:
    """Price a request's worst case for ``tenant``. Raises ``UnknownPrice`` (per the plan's
    policy) or ``OutputCeilingRequired``. ``in_effect``: the model's price version in effect at
    ``start``, when the caller has already read it."""
    pricing = pricing_for_request(
        plan=tenant.plan, provider=provider, model=model, at=start, in_effect=in_effect
    )
    ceiling = output_ceiling(requested=max_output_tokens, plan=tenant.plan, price=pricing.price)
    if ceiling is None:
        raise OutputCeilingRequired()
    if pricing.price is None:
        fixed = round_hold(pricing.fixed_amount or Decimal(0))
        items = [Item("fixed_per_request", 1, fixed, fixed)]
    else:
        items = worst_case_items(
            pricing.price,
            input_tokens=input_tokens,
            max_output_tokens=ceiling,
            start=start,
            end=end,
            tool_calls=max_tool_calls,
            service_tier=service_tier,
        )
    amount = round_hold(sum((item.amount for item in items), Decimal(0)))
    markup = tenant_markup(tenant)
    return Estimate(
        price=pricing.price,
        pricing_basis=pricing.basis,
        input_tokens=input_tokens,
        max_output_tokens=ceiling,
        items=items,
        amount=amount,
        markup_percent=markup,
        customer_amount=customer_hold(amount, markup),
    )


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
    # Which rule of llm_budgets.model_names found the price (None: the unknown-model policy).
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
