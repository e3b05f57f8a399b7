"""Estimating a request before it runs: the price (or policy) that applies, the output ceiling,
the itemised worst case at provider cost and at customer price. Admission holds what
:func:`request_estimate` says; :func:`llm_budgets.reads.quotes.quote` shows it, and the budgets it
would draw on, without holding anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage, OutputCeilingRequired
from llm_budgets.models import Price, Tenant
from llm_budgets.money import round_hold
from llm_budgets.pricing.costs import Item, customer_hold, input_tolerance, worst_case_items
from llm_budgets.pricing.prices import output_ceiling, pricing_for_request
from llm_budgets.pricing.tokens import count_input_tokens


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
    # Of ``amount`` and ``customer_amount``, the input tolerance's part (rounded up as they are):
    # what the hold keeps for the input a commit may report beyond the held count.
    input_tolerance: Decimal = Decimal(0)
    customer_input_tolerance: Decimal = Decimal(0)


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
    """Price a request's worst case for ``tenant``, the input tolerance included
    (``costs.worst_case_items``): what admission holds, a quote shows and a refusal names.
    Raises ``UnknownPrice`` (per the plan's policy) or ``OutputCeilingRequired``.
    ``in_effect``: the model's price version in effect at ``start``, when the caller has
    already read it."""
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
    tolerance = round_hold(input_tolerance(items))
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
        input_tolerance=tolerance,
        customer_input_tolerance=customer_hold(tolerance, markup),
    )
