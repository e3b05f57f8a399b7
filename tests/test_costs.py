"""Cost arithmetic (issue 3 items 1 and 10): dimensions, tiers, time of day, rounding rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_budgets.models import Price
from llm_budgets.pricing.costs import (
    actual_cost,
    customer_charge,
    customer_hold,
    input_tolerance,
    usage_items,
    worst_case,
    worst_case_items,
)
from llm_budgets.results import Item
from llm_budgets.usage import input_allowed, usage_validate

T = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def _price(**fields: object) -> Price:
    values: dict[str, object] = {"input_per_mtok": Decimal(3), "output_per_mtok": Decimal(15)}
    values.update(fields)
    return Price(provider="p", model="m", **values)


def _hold(price: Price, input_tokens: int, output: int, *, minutes: int = 2) -> Decimal:
    return worst_case(
        price,
        input_tokens=input_tokens,
        max_output_tokens=output,
        start=T,
        end=T + timedelta(minutes=minutes),
    )


def test_plain_input_and_output() -> None:
    usage = usage_validate(input_tokens=1000, output_tokens=200)
    assert actual_cost(_price(), usage, at=T) == Decimal("0.006")  # 3e-3 + 3e-3
    # The hold: 1000 input tokens and the tolerance (100 + 256) at 3, 500 output tokens at 15.
    assert _hold(_price(), 1000, 500) == Decimal("0.011568")


def test_cache_reads_and_writes_are_parts_of_input() -> None:
    price = _price(
        cached_input_per_mtok=Decimal("0.3"),
        cache_write_per_mtok=Decimal("3.75"),
        cache_write_1h_per_mtok=Decimal(6),
    )
    usage = usage_validate(
        input_tokens=10_000,
        output_tokens=0,
        cached_input_tokens=4_000,
        cache_write_tokens=3_000,
        cache_write_1h_tokens=1_000,
    )
    by_dimension = {i.dimension: i.quantity for i in usage_items(price, usage, at=T)}
    assert by_dimension["input_per_mtok"] == 3_000
    assert by_dimension["cached_input_per_mtok"] == 4_000
    assert by_dimension["cache_write_per_mtok"] == 2_000
    assert by_dimension["cache_write_1h_per_mtok"] == 1_000
    # 3000*3 + 4000*0.3 + 2000*3.75 + 1000*6 = 9000 + 1200 + 7500 + 6000 per million
    assert actual_cost(price, usage, at=T) == Decimal("0.0237")


def test_unpriced_cache_tokens_cost_as_input() -> None:
    usage = usage_validate(
        input_tokens=1_000, output_tokens=0, cached_input_tokens=500, cache_write_tokens=500
    )
    assert actual_cost(_price(), usage, at=T) == Decimal("0.003")


def test_worst_case_uses_the_dearest_input_side_rate() -> None:
    # A cache write costs more than plain input: the hold must cover every token written.
    price = _price(cache_write_per_mtok=Decimal("3.75"), cache_write_1h_per_mtok=Decimal(6))
    items = worst_case_items(
        price, input_tokens=1_000_000, max_output_tokens=0, start=T, end=T + timedelta(minutes=1)
    )
    assert items[0].dimension == "cache_write_1h_per_mtok"
    assert items[1] == Item("input_tolerance", 100_256, Decimal(6), Decimal("0.601536"))
    assert _hold(price, 1_000_000, 0) == Decimal("6.601536")


def test_reasoning_counts_as_output_unless_priced_apart() -> None:
    usage = usage_validate(input_tokens=0, output_tokens=1_000_000, reasoning_tokens=400_000)
    assert actual_cost(_price(), usage, at=T) == Decimal(15)
    apart = _price(reasoning_per_mtok=Decimal(20))
    assert actual_cost(apart, usage, at=T) == Decimal(17)  # 0.6*15 + 0.4*20
    assert _hold(apart, 0, 1_000_000) == Decimal("20.000768")  # and 256 input tokens at 3


def test_per_request_and_tool_fees() -> None:
    price = _price(per_request=Decimal("0.001"), tool_fees={"web_search": "0.01"})
    usage = usage_validate(
        input_tokens=0, output_tokens=0, tool_calls={"web_search": 3, "unpriced_tool": 2}
    )
    assert actual_cost(price, usage, at=T) == Decimal("0.031")
    assert _hold(price, 0, 1) == Decimal("0.001783")  # 0.001 + 15e-6 + 256 x 3e-6


def test_a_tier_prices_every_token_of_a_request_that_reaches_it() -> None:
    price = _price(
        tiers=[
            {
                "above_input_tokens": 200_000,
                "prices": {"input_per_mtok": "6", "output_per_mtok": "22.5"},
            }
        ]
    )
    small = usage_validate(input_tokens=200_000, output_tokens=1_000_000)
    large = usage_validate(input_tokens=200_001, output_tokens=1_000_000)
    assert actual_cost(price, small, at=T) == Decimal("15.6")
    assert actual_cost(price, large, at=T) == Decimal("23.700006")
    # A hold prices the held input and its tolerance (10% + 256) at the tier they can reach.
    assert _hold(price, 100_000, 1_000_000) == Decimal("15.330768")  # 110,256 x 3 + 15
    assert _hold(price, 200_000, 1_000_000) == Decimal("23.821536")  # 220,256 x 6 + 22.5
    assert _hold(price, 200_001, 1_000_000) == Decimal("23.821542")


OFF_PEAK = {"start": "16:30:00", "end": "00:30:00", "prices": {"input_per_mtok": "1"}}


def test_a_hold_uses_the_off_peak_rate_only_when_the_whole_call_falls_in_it() -> None:
    price = _price(daily_spans=[OFF_PEAK])
    inside = datetime(2026, 3, 2, 20, 0, tzinfo=UTC)

    def hold(start: datetime, minutes: int) -> Decimal:
        return worst_case(
            price,
            input_tokens=1_000_000,
            max_output_tokens=0,
            start=start,
            end=start + timedelta(minutes=minutes),
        )

    # 1,100,256 input tokens, the tolerance included, at 1 off-peak or 3 at peak.
    off_peak, peak = Decimal("1.100256"), Decimal("3.300768")
    assert hold(inside, 60) == off_peak  # 20:00-21:00, all off-peak
    assert hold(inside.replace(hour=0, minute=0), 60) == peak  # 00:00-01:00 crosses out
    assert hold(inside.replace(hour=16, minute=0), 20) == peak  # peak
    assert hold(inside.replace(hour=16, minute=0), 60) == peak  # crosses into off-peak
    assert hold(inside, 26 * 60) == peak  # longer than a day


def test_a_charge_uses_the_rate_at_its_time() -> None:
    price = _price(daily_spans=[OFF_PEAK])
    usage = usage_validate(input_tokens=1_000_000, output_tokens=0)
    assert actual_cost(price, usage, at=datetime(2026, 3, 2, 23, 59, tzinfo=UTC)) == 1
    assert actual_cost(price, usage, at=datetime(2026, 3, 2, 0, 29, tzinfo=UTC)) == 1
    assert actual_cost(price, usage, at=datetime(2026, 3, 2, 0, 30, tzinfo=UTC)) == 3


def test_holds_round_up_and_charges_round_half_even() -> None:
    # 0.00015 per million tokens: one token costs 1.5e-10, five cost 7.5e-10 (quantum 1e-10).
    price = _price(input_per_mtok=Decimal("0.00015"), output_per_mtok=Decimal(0))
    one = usage_validate(input_tokens=1, output_tokens=0)
    assert actual_cost(price, one, at=T) == Decimal("2E-10")  # 1.5 -> 2 (to even)
    cheaper = _price(input_per_mtok=Decimal("0.00025"), output_per_mtok=Decimal(0))
    assert actual_cost(cheaper, one, at=T) == Decimal("2E-10")  # 2.5 -> 2 (to even)
    # A hold of 1 input token holds 257 (the tolerance): 642.5 quanta, rounded up.
    assert _hold(cheaper, 1, 0) == Decimal("6.43E-8")
    tiny = _price(input_per_mtok=Decimal("0.0000001"), output_per_mtok=Decimal(0))
    assert _hold(tiny, 1, 0) == Decimal("1E-10")  # 2.57e-11 rounds up to one quantum, never 0


def test_customer_amounts_apply_the_markup_with_the_same_rules() -> None:
    assert customer_hold(Decimal("0.0000000003"), Decimal(50)) == Decimal("5E-10")  # 4.5 up
    assert customer_charge(Decimal("0.0000000003"), Decimal(50)) == Decimal("4E-10")  # to even
    assert customer_charge(Decimal(10), Decimal("-10")) == Decimal(9)


def test_a_premium_service_tier_replaces_the_rates_and_an_unlisted_one_is_refused() -> None:
    import pytest

    from llm_budgets.exceptions import InvalidUsage, UnknownPrice
    from llm_budgets.pricing.prices import price_values

    price = _price(service_tiers={"priority": {"input_per_mtok": "5.1", "output_per_mtok": "25.5"}})
    usage = usage_validate(input_tokens=1000, output_tokens=200)
    assert actual_cost(price, usage, at=T) == Decimal("0.006")
    assert actual_cost(price, usage, at=T, service_tier="priority") == Decimal("0.0102")
    held = worst_case(
        price, input_tokens=1000, max_output_tokens=500, start=T, end=T, service_tier="priority"
    )
    assert held == Decimal("0.0196656")  # 1356 x 5.1 + 500 x 25.5, per million
    with pytest.raises(UnknownPrice, match="fast"):
        actual_cost(price, usage, at=T, service_tier="fast")
    with pytest.raises(InvalidUsage, match="service_tiers"):
        price_values(input_per_mtok=1, output_per_mtok=1, service_tiers={"fast": {"speed": "6"}})


def test_the_worst_case_holds_the_input_tolerance_as_its_own_item() -> None:
    """Issue #38: a commit may report 10% + 256 input tokens beyond the held count; the worst
    case holds them too, itemised, so quotes and refusals can say what part of a hold they are."""
    items = worst_case_items(
        _price(), input_tokens=1000, max_output_tokens=500, start=T, end=T + timedelta(minutes=1)
    )
    assert [(i.dimension, i.quantity, i.rate) for i in items] == [
        ("input_per_mtok", 1000, Decimal(3)),
        ("input_tolerance", 356, Decimal(3)),
        ("output_per_mtok", 500, Decimal(15)),
    ]
    assert input_tolerance(items) == Decimal("0.001068")


def test_a_tolerance_that_reaches_a_dearer_tier_prices_the_whole_call_at_it() -> None:
    # 190,000 held: a commit may report 209,256, past the 200,000 tier, where every token of the
    # request costs more: the hold is the whole call at that tier.
    price = _price(tiers=[{"above_input_tokens": 200_000, "prices": {"input_per_mtok": "6"}}])
    assert _hold(price, 190_000, 0) == Decimal("1.255536")  # 209,256 x 6
    usage = usage_validate(input_tokens=input_allowed(190_000), output_tokens=0)
    assert actual_cost(price, usage, at=T) == Decimal("1.255536")
    assert _hold(price, 150_000, 0) == Decimal("0.495768")  # 165,256 x 3: out of its reach


TIERED_SPANNED = _price(
    cached_input_per_mtok=Decimal("0.3"),
    cache_write_per_mtok=Decimal("3.75"),
    reasoning_per_mtok=Decimal(20),
    per_request=Decimal("0.001"),
    tool_fees={"web_search": "0.01"},
    tiers=[
        {"above_input_tokens": 2_000, "prices": {"input_per_mtok": "6", "output_per_mtok": "30"}}
    ],
    daily_spans=[OFF_PEAK],
)


@settings(max_examples=60, deadline=None, database=None)
@given(
    held=st.integers(0, 3_000),
    ceiling=st.integers(0, 2_000),
    searches=st.integers(0, 2),
    data=st.data(),
    start_minute=st.integers(0, 24 * 60 - 1),
    ttl_minutes=st.sampled_from([1, 60, 600]),
)
def test_a_commit_within_the_rule_never_costs_more_than_its_hold(
    held: int,
    ceiling: int,
    searches: int,
    data: st.DataObject,
    start_minute: int,
    ttl_minutes: int,
) -> None:
    """Issue #38: whatever usage the plausibility rule admits (input up to the held count plus
    the tolerance, any cache mix, output and reasoning up to the ceiling, the tools held), at any
    moment of the hold's lifetime, at any tier and span, costs at most the hold: nothing a
    caller reports within the rule can add up past a limit."""
    start = datetime(2026, 3, 2, tzinfo=UTC) + timedelta(minutes=start_minute)
    end = start + timedelta(minutes=ttl_minutes)
    hold = worst_case(
        TIERED_SPANNED,
        input_tokens=held,
        max_output_tokens=ceiling,
        start=start,
        end=end,
        tool_calls={"web_search": searches},
    )
    # The edges (all the rule admits) as often as anything in between.
    reported = data.draw(st.just(input_allowed(held)) | st.integers(0, input_allowed(held)))
    cached = data.draw(st.integers(0, reported))
    written = data.draw(st.integers(0, reported - cached))
    output = data.draw(st.just(ceiling) | st.integers(0, ceiling))
    usage = usage_validate(
        input_tokens=reported,
        output_tokens=output,
        cached_input_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=data.draw(st.integers(0, output)),
        tool_calls={"web_search": data.draw(st.integers(0, searches))},
    )
    at = start + (end - start) * data.draw(st.floats(0, 1))
    assert actual_cost(TIERED_SPANNED, usage, at=at) <= hold


# -- billing modifiers (issue #39, interface 2) -------------------------------------------------


def _provider_price(provider: str, **fields: object) -> Price:
    values: dict[str, object] = {"input_per_mtok": Decimal(3), "output_per_mtok": Decimal(15)}
    values.update(fields)
    return Price(provider=provider, model="m", **values)


def _charge(price: Price, tier: str) -> Decimal:
    usage = usage_validate(input_tokens=1000, output_tokens=200)  # 0.006 at the standard rates
    return actual_cost(price, usage, at=T, service_tier=tier)


def _held(price: Price, tier: str) -> Decimal:
    return worst_case(
        price, input_tokens=1000, max_output_tokens=500, start=T, end=T, service_tier=tier
    )


def test_a_modifier_the_price_does_not_list_is_its_published_multiplier() -> None:
    openai, anthropic = _provider_price("openai"), _provider_price("anthropic")
    assert _charge(openai, "priority") == Decimal("0.012")
    assert _charge(openai, "flex") == Decimal("0.003")  # held and charged at flex, not standard
    assert _held(openai, "flex") == _held(openai, "") / 2
    assert _charge(anthropic, "fast") == Decimal("0.036")
    assert _charge(anthropic, "geo_us") == Decimal("0.0066")
    assert _charge(anthropic, "fast+geo_us") == Decimal("0.0396")  # 6 x 1.1
    assert _held(anthropic, "fast+geo_us") == _held(anthropic, "") * Decimal("6.6")


def test_a_listed_modifier_gives_its_rates_and_the_others_multiply_them() -> None:
    fast = {"input_per_mtok": "30", "output_per_mtok": "150"}
    price = _provider_price("anthropic", service_tiers={"fast": fast})
    assert _charge(price, "fast") == Decimal("0.06")  # 1000 x 30 + 200 x 150, per million
    assert _charge(price, "fast+geo_us") == Decimal("0.066")
    both = _provider_price("anthropic", service_tiers={"fast": fast, "fast+geo_us": fast})
    assert _charge(both, "fast+geo_us") == Decimal("0.06")  # the combination as listed


def test_a_modifier_neither_listed_nor_multiplied_is_refused_never_standard() -> None:
    import pytest

    from llm_budgets.exceptions import UnknownPrice

    with pytest.raises(UnknownPrice, match="'scale'") as refused:
        _charge(_provider_price("openai"), "scale")
    assert "SERVICE_TIER_MULTIPLIERS" in refused.value.message
    with pytest.raises(UnknownPrice, match="'fast'"):
        _held(_provider_price("openai"), "priority+fast")  # fast is Anthropic's
    listed = {"input_per_mtok": "6"}
    two = _provider_price("openai", service_tiers={"priority": listed, "flex": listed})
    with pytest.raises(UnknownPrice, match="priority\\+flex"):
        _charge(two, "priority+flex")  # each would replace the same rates


def test_the_operator_overrides_or_adds_multipliers() -> None:
    from django.test import override_settings

    table = {"openai": {"priority": "2.5"}, "azure": {"priority": 3}}
    with override_settings(LLM_BUDGETS={"SERVICE_TIER_MULTIPLIERS": table}):
        assert _charge(_provider_price("openai"), "priority") == Decimal("0.015")
        assert _charge(_provider_price("azure"), "priority") == Decimal("0.018")


def test_a_multiplier_applies_on_top_of_a_prompt_size_tier() -> None:
    """A long-context call in fast mode pays both: the tier's rates, times the multiplier."""
    price = _provider_price(
        "anthropic",
        tiers=[
            {
                "above_input_tokens": 500,
                "prices": {"input_per_mtok": "6", "output_per_mtok": "22.5"},
            }
        ],
    )
    assert _charge(price, "") == Decimal("0.0105")
    assert _charge(price, "fast") == Decimal("0.0630")
