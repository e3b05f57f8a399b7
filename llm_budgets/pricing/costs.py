"""What a price version makes of usage: the worst case of a request and the cost of actual usage,
itemised, plus the customer price (markup).

Rates are per million tokens (tool fees and the request fee per call). Rounding happens once, on
the total: a hold rounds **up**, a charge **half-even**, to the stored precision (``money.py``).

Which rates apply:

- **Tiers**: above a prompt size a provider may charge more for every token of the request. The
  request's total input tokens (cache reads and writes included) pick the tier, for the hold and for
  the charge alike.
- **Daily spans** (time of day, UTC): a span's rates replace the version's own while it lasts. A
  charge uses the rates at the moment the call is settled, clamped to the reservation's lifetime; a
  hold uses the highest rates that may apply at any moment of that lifetime, so it uses a cheaper
  span only when the whole call surely falls in it.
- **Cache**: cache reads at ``cached_input_per_mtok``, writes at ``cache_write_per_mtok`` (1-hour
  writes at ``cache_write_1h_per_mtok``); an empty rate prices those tokens as plain input. The
  worst case prices every input token at the highest input-side rate (a cache write can cost more
  than plain input) and every output token at the higher of output and reasoning.
- **Billing modifiers** (a service tier, fast mode, a region; ``"fast+geo_us"`` for several):
  rates a version lists for one replace its own; any other multiplies the rates that apply by
  the provider's figure in ``SERVICE_TIER_MULTIPLIERS``; one in neither place is
  ``UnknownPrice`` (:func:`tier_rates`), never the standard rates.
- **The input tolerance**: a commit may report more input than the hold counted
  (``usage.input_allowed``: 10% + 256 tokens). The worst case holds those tokens too, as their own
  item (``input_tolerance``), and at every tier an input count up to that allowance can reach: a
  commit within the rule never costs more than its hold, so the allowance cannot add up past a
  limit (docs/limits.md, "How far a counter can pass its limit").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from llm_budgets.conf import conf
from llm_budgets.exceptions import UnknownPrice
from llm_budgets.models import Price
from llm_budgets.money import MILLION, ZERO, round_charge, round_hold
from llm_budgets.results import Item
from llm_budgets.usage import Usage, input_allowed

# The per-million-token rates of a version, in the order they are itemised.
TOKEN_RATES = (
    "input_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "output_per_mtok",
    "reasoning_per_mtok",
)
INPUT_RATES = TOKEN_RATES[:4]
# The worst case's item for the input a commit may report beyond the held count.
INPUT_TOLERANCE = "input_tolerance"
ONE = Decimal(1)
HUNDRED = Decimal(100)


Rates = dict[str, Decimal | None]


def _parse_time(value: str) -> time:
    return time.fromisoformat(value)


def span_contains(span: Mapping[str, Any], at: datetime) -> bool:
    start, end = _parse_time(span["start"]), _parse_time(span["end"])
    moment = at.astimezone(UTC).time()
    if end <= start:  # crosses midnight
        return moment >= start or moment < end
    return start <= moment < end


def _span_at(price: Price, at: datetime) -> int | None:
    for index, span in enumerate(price.daily_spans or []):
        if span_contains(span, at):
            return index
    return None


def _spans_between(price: Price, start: datetime, end: datetime) -> set[int | None]:
    """Every span (None: the version's own rates) in effect at some moment of [start, end]."""
    spans = price.daily_spans or []
    if not spans:
        return {None}
    moments = [start]
    day = start.astimezone(UTC).date() - timedelta(days=1)
    while day <= end.astimezone(UTC).date():
        for span in spans:
            for key in ("start", "end"):
                moment = datetime.combine(day, _parse_time(span[key]), tzinfo=UTC)
                if start < moment <= end:
                    moments.append(moment)
        day += timedelta(days=1)
    return {_span_at(price, moment) for moment in moments}


# Joins the billing modifiers of one call in ``Reservation.service_tier`` ("fast+geo_us").
MODIFIER_JOIN = "+"


class TierRates(NamedTuple):
    """What a call's billing modifiers do to a version's rates: ``listed`` replaces rates by
    name (the one modifier the version lists in ``service_tiers``), then every token rate is
    multiplied by ``multiplier`` (the product of the other modifiers' multipliers)."""

    listed: Mapping[str, str | None]
    multiplier: Decimal


STANDARD = TierRates({}, ONE)


def tier_rates(price: Price, service_tier: str) -> TierRates:
    """The rates of ``service_tier``: one modifier (``"priority"``, ``"flex"``, ``"fast"``,
    ``"geo_us"``) or several joined with ``+`` (``"fast+geo_us"``). A modifier the version lists
    in ``service_tiers`` gives its rates (at most one may: two would each replace the same
    rates); any other is its multiplier from ``SERVICE_TIER_MULTIPLIERS`` for the price's
    provider. A whole composite the version lists is taken as it is. A modifier with neither is
    ``UnknownPrice``: never the standard rates (nothing widens spending)."""
    if not service_tier:
        return STANDARD
    tiers = price.service_tiers or {}
    if service_tier in tiers:
        return TierRates(tiers[service_tier], ONE)
    listed: list[str] = []
    multiplier = ONE
    known = conf.SERVICE_TIER_MULTIPLIERS.get(price.provider, {})
    for modifier in service_tier.split(MODIFIER_JOIN):
        if modifier in tiers:
            listed.append(modifier)
        elif modifier in known:
            multiplier *= known[modifier]
        else:
            raise UnknownPrice(provider=price.provider, model=price.model, service_tier=modifier)
    if len(listed) > 1:
        # Each listed modifier's rates replace the same rates: the combination needs its own.
        raise UnknownPrice(provider=price.provider, model=price.model, service_tier=service_tier)
    return TierRates(tiers[listed[0]] if listed else {}, multiplier)


def rates(
    price: Price, *, input_tokens: int, span: int | None = None, service_tier: str = ""
) -> Rates:
    """The rates for a request of ``input_tokens`` (which picks the tier) in ``span``, at
    ``service_tier``: rates the version lists for it replace the others (prompt-size tiers and
    daily spans do not apply on top of a listed premium tier); a modifier priced by multiplier
    multiplies whatever rates apply (a long-context call in fast mode costs both)."""
    result: Rates = {name: getattr(price, name) for name in TOKEN_RATES}
    if span is not None:
        overrides = price.daily_spans[span]["prices"]
    else:
        overrides = {}
        for tier in price.tiers or []:
            if input_tokens > tier["above_input_tokens"]:
                overrides = tier["prices"]
    tier = tier_rates(price, service_tier)
    for name, value in {**overrides, **tier.listed}.items():
        result[name] = None if value is None else Decimal(value)
    if tier.multiplier != ONE:
        result = {name: None if v is None else v * tier.multiplier for name, v in result.items()}
    return result


def _token_item(dimension: str, quantity: int, rate: Decimal) -> Item:
    return Item(dimension, quantity, rate, Decimal(quantity) * rate / MILLION)


def _fee_items(price: Price, tool_calls: Mapping[str, int]) -> list[Item]:
    items = []
    if price.per_request:
        items.append(Item("per_request", 1, price.per_request, price.per_request))
    fees = price.tool_fees or {}
    for tool, count in sorted(tool_calls.items()):
        if count and tool in fees:
            fee = Decimal(fees[tool])
            items.append(Item(f"tool:{tool}", count, fee, count * fee))
    return items


def usage_items(price: Price, usage: Usage, *, at: datetime, service_tier: str = "") -> list[Item]:
    """Actual usage, itemised at the rates in effect at ``at`` (at ``service_tier``)."""
    rate = rates(
        price,
        input_tokens=usage.input_tokens,
        span=_span_at(price, at),
        service_tier=service_tier,
    )
    items = []
    plain_input = usage.input_tokens
    writes = usage.cache_write_tokens
    base_input = rate["input_per_mtok"] or ZERO
    if rate["cache_write_1h_per_mtok"] is not None and usage.cache_write_1h_tokens:
        items.append(
            _token_item(
                "cache_write_1h_per_mtok",
                usage.cache_write_1h_tokens,
                rate["cache_write_1h_per_mtok"],
            )
        )
        writes -= usage.cache_write_1h_tokens
        plain_input -= usage.cache_write_1h_tokens
    for dimension, quantity in (
        ("cached_input_per_mtok", usage.cached_input_tokens),
        ("cache_write_per_mtok", writes),
    ):
        if rate[dimension] is not None and quantity:
            items.append(_token_item(dimension, quantity, rate[dimension]))  # type: ignore[arg-type]
            plain_input -= quantity
    items.insert(0, _token_item("input_per_mtok", plain_input, base_input))
    output = usage.output_tokens
    if rate["reasoning_per_mtok"] is not None and usage.reasoning_tokens:
        items.append(
            _token_item("reasoning_per_mtok", usage.reasoning_tokens, rate["reasoning_per_mtok"])
        )
        output -= usage.reasoning_tokens
    items.insert(1, _token_item("output_per_mtok", output, rate["output_per_mtok"] or ZERO))
    return items + _fee_items(price, usage.tool_calls)


def _tier_inputs(price: Price, most: int) -> list[int]:
    """An input count for each tier some count from 0 to ``most`` picks (tiers change only just
    above a threshold): the worst case takes the dearest of them."""
    thresholds = {tier["above_input_tokens"] for tier in price.tiers or []}
    return [0, *sorted(t + 1 for t in thresholds if t < most)]


def worst_case_items(
    price: Price,
    *,
    input_tokens: int,
    max_output_tokens: int,
    start: datetime,
    end: datetime,
    tool_calls: Mapping[str, int] | None = None,
    service_tier: str = "",
) -> list[Item]:
    """The most a request can cost, itemised: the held input and the input tolerance
    (``usage.input_allowed``) at the highest input-side rate, every output token at the higher
    of output and reasoning, at the dearest tier an input count up to that allowance picks, in
    the dearest span that may apply between ``start`` and ``end`` (at ``service_tier``). A commit
    within the plausibility rule (``usage.usage_within_hold``) never costs more."""
    tolerance = input_allowed(input_tokens) - input_tokens
    candidates = []
    for span in _spans_between(price, start, end):
        for tier_input in _tier_inputs(price, input_tokens + tolerance):
            rate = rates(price, input_tokens=tier_input, span=span, service_tier=service_tier)
            input_name = max(
                (n for n in INPUT_RATES if rate[n] is not None),
                key=lambda n: rate[n],  # type: ignore[arg-type,return-value]
            )
            input_rate = rate[input_name] or ZERO
            output_name = "output_per_mtok"
            if (rate["reasoning_per_mtok"] or ZERO) > (rate["output_per_mtok"] or ZERO):
                output_name = "reasoning_per_mtok"
            items = [
                _token_item(input_name, input_tokens, input_rate),
                _token_item(INPUT_TOLERANCE, tolerance, input_rate),
                _token_item(output_name, max_output_tokens, rate[output_name] or ZERO),
                *_fee_items(price, tool_calls or {}),
            ]
            candidates.append(items)
    return max(candidates, key=total)


def input_tolerance(items: list[Item]) -> Decimal:
    """Of a worst case's ``items``, the input tolerance's part (unrounded)."""
    return sum((item.amount for item in items if item.dimension == INPUT_TOLERANCE), ZERO)


def total(items: list[Item]) -> Decimal:
    return sum((item.amount for item in items), ZERO)


def worst_case(
    price: Price,
    *,
    input_tokens: int,
    max_output_tokens: int,
    start: datetime,
    end: datetime,
    tool_calls: Mapping[str, int] | None = None,
    service_tier: str = "",
) -> Decimal:
    """The hold for a request: its worst case, rounded up."""
    return round_hold(
        total(
            worst_case_items(
                price,
                input_tokens=input_tokens,
                max_output_tokens=max_output_tokens,
                start=start,
                end=end,
                tool_calls=tool_calls,
                service_tier=service_tier,
            )
        )
    )


def actual_cost(price: Price, usage: Usage, *, at: datetime, service_tier: str = "") -> Decimal:
    """What reported usage costs at ``price`` (at ``service_tier``), rounded half-even."""
    return round_charge(total(usage_items(price, usage, at=at, service_tier=service_tier)))


def markup_factor(markup_percent: Decimal) -> Decimal:
    return ONE + markup_percent / HUNDRED


def customer_hold(amount: Decimal, markup_percent: Decimal) -> Decimal:
    """A hold at customer price: the provider-cost hold with the markup, rounded up."""
    return round_hold(amount * markup_factor(markup_percent))


def customer_charge(cost: Decimal, markup_percent: Decimal) -> Decimal:
    """A charge at customer price: the provider cost with the markup, rounded half-even."""
    return round_charge(cost * markup_factor(markup_percent))
