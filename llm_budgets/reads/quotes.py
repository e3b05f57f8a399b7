"""A quote: the estimate of a request and the budgets it would draw on, without holding
anything (``reserve`` would hold what :func:`llm_budgets.pricing.estimates.request_estimate`
says). Built here, returned as :class:`llm_budgets.results.Quote` (plain data, no model)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.engine.applicable import scopes_for_read, shared_by_tenants
from llm_budgets.models import ApiKey, BudgetUnit, EndUser, PricingBasis
from llm_budgets.pricing.estimates import Estimate, input_token_count, request_estimate
from llm_budgets.pricing.prices import price_match, price_result
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.request import Request
from llm_budgets.results import BudgetDraw, Quote, QuoteEstimate

__all__ = ["BudgetDraw", "Quote", "for_tenant", "quote", "quote_estimate", "request_quote"]
from llm_budgets.tenancy.tenants import tenant_get


def for_tenant(quote: Quote) -> Quote:
    """The quote as a tenant's key may see it: budgets every tenant shares are left out (their
    figures are other tenants' spend), yet still decide ``admissible`` (``withheld_fits``)."""
    shared = [draw for draw in quote.budgets if shared_by_tenants(draw.status.scope)]
    return replace(
        quote,
        budgets=[draw for draw in quote.budgets if draw not in shared],
        withheld_fits=quote.withheld_fits + tuple(draw.fits for draw in shared),
    )


def quote_estimate(estimate: Estimate) -> QuoteEstimate:
    """The estimate admission holds, as a quote shows it (the price version as plain data)."""
    return QuoteEstimate(
        price=price_result(estimate.price) if estimate.price is not None else None,
        pricing_basis=estimate.pricing_basis,
        input_tokens=estimate.input_tokens,
        max_output_tokens=estimate.max_output_tokens,
        items=list(estimate.items),
        amount=estimate.amount,
        markup_percent=estimate.markup_percent,
        customer_amount=estimate.customer_amount,
        input_tolerance=estimate.input_tolerance,
        customer_input_tolerance=estimate.customer_input_tolerance,
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
    return Quote(provider, model, quote_estimate(estimate), draws, conf.CURRENCY, match)
