"""Estimating a request before it runs: the price (or policy) that applies, the output ceiling,
the itemised worst case at provider cost and at customer price. Admission holds what
:func:`request_estimate` says; :func:`quote` shows it, and the budgets it would draw on, without
holding anything."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

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
from llm_budgets.request import Request
from llm_budgets.selectors import (
    BudgetStatus,
    budget_statuses,
    scopes_for_read,
    shared_by_tenants,
)
from llm_budgets.tenants import tenant_get
from llm_budgets.tokens import count_input_tokens


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
    """:func:`request_quote` of the :class:`~llm_budgets.request.Request` these fields
    describe."""
    fields: dict[str, Any] = {
        "tenant": tenant,
        "model": model,
        "provider": provider,
        "input_tokens": input_tokens,
        "messages": messages,
        "prompt": prompt,
        "max_output_tokens": max_output_tokens,
        "end_user": end_user,
        "ttl": ttl,
        "max_tool_calls": max_tool_calls,
        "run": run,
        "tags": tags,
    }
    return request_quote(Request(**fields), api_key=api_key, now=now)


def request_quote(
    call: Request, *, api_key: ApiKey | None = None, now: datetime | None = None
) -> Quote:
    """The itemised worst case, the price version and the budgets a request would draw on.
    Reads only: nothing is held or created. Its run, tags and ``api_key`` (the REST key it
    came through): the budgets of the run, tags and key the call would name apply too. The
    idempotency key and ``allow_degrade`` play no part (a quote holds nothing)."""
    request = call.checked()
    assert request.tenant is not None  # checked
    provider, model = request.provider, request.model
    tokens = input_token_count(
        provider=provider,
        model=model,
        input_tokens=request.input_tokens,
        messages=request.messages,
        prompt=request.prompt,
    )
    now = now or timezone.now()
    with ledger_guard("quote"):
        tenant_obj = tenant_get(request.tenant)
        estimate = request_estimate(
            tenant_obj,
            provider=provider,
            model=model,
            input_tokens=tokens,
            max_output_tokens=request.max_output_tokens,
            start=now,
            end=now + request.lifetime,
            max_tool_calls=dict(request.max_tool_calls or {}),
        )
        user_obj = None
        if request.end_user is not None:
            user_obj = tenant_obj.end_users.filter(external_id=request.end_user).first() or EndUser(
                tenant=tenant_obj, external_id=request.end_user
            )
        draws = []
        scopes = scopes_for_read(tenant_obj, run=request.run, tags=request.tags, api_key=api_key)
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
