"""Usage conventions (issue 3 item 3): OpenAI's shape and Anthropic's, translated in one place."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest

from llm_budgets import budgets
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import UsageRecord
from llm_budgets.usage import Usage, from_anthropic, from_openai, usage_keywords, usage_validate

# The same call as each provider reports it: 10,000 input tokens of which 6,000 were read from the
# cache and 2,000 written to it (500 of those to the 1-hour cache), 300 output tokens.
ANTHROPIC = {
    "input_tokens": 2_000,  # excludes cache reads and writes
    "cache_read_input_tokens": 6_000,
    "cache_creation_input_tokens": 2_000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1_500, "ephemeral_1h_input_tokens": 500},
    "output_tokens": 300,
    "server_tool_use": {"web_search_requests": 2},
}
EXPECTED = Usage(
    input_tokens=10_000,
    output_tokens=300,
    cached_input_tokens=6_000,
    cache_write_tokens=2_000,
    cache_write_1h_tokens=500,
    tool_calls={"web_search": 2},
)


def test_anthropic_usage_adds_cache_reads_and_writes_back_into_input() -> None:
    assert from_anthropic(ANTHROPIC) == EXPECTED
    # The SDK object reads the same as the dict.
    sdk = SimpleNamespace(
        **{**ANTHROPIC, "cache_creation": SimpleNamespace(**ANTHROPIC["cache_creation"])},  # type: ignore[arg-type]
    )
    sdk.server_tool_use = SimpleNamespace(web_search_requests=2)
    assert from_anthropic(sdk) == EXPECTED


def test_anthropic_usage_without_cache_fields() -> None:
    assert from_anthropic({"input_tokens": 12, "output_tokens": 3}) == Usage(12, 3)


def test_openai_usage_already_counts_cached_tokens_in_input() -> None:
    chat = {
        "prompt_tokens": 10_000,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 6_000},
        "completion_tokens_details": {"reasoning_tokens": 120},
    }
    responses = {
        "input_tokens": 10_000,
        "output_tokens": 300,
        "input_tokens_details": {"cached_tokens": 6_000},
        "output_tokens_details": {"reasoning_tokens": 120},
    }
    expected = Usage(10_000, 300, cached_input_tokens=6_000, reasoning_tokens=120)
    assert from_openai(chat) == expected
    assert from_openai(responses) == expected


def test_openai_usage_counts_cache_writes_where_reported() -> None:
    # Regression: ``cache_write_tokens`` (in prompt/input token details, next to cached_tokens)
    # was ignored, so writes were priced as plain input. They are part of input already; the
    # 30-minute/12-hour split has no 1-hour rate of ours: every write is priced as a write.
    details = {
        "cached_tokens": 6_000,
        "cache_write_tokens": 2_000,
        "cache_write_tokens_details": {"ttl_30m_tokens": 1_500, "ttl_12h_tokens": 500},
    }
    chat = {"prompt_tokens": 10_000, "completion_tokens": 300, "prompt_tokens_details": details}
    responses = {"input_tokens": 10_000, "output_tokens": 300, "input_tokens_details": details}
    expected = Usage(10_000, 300, cached_input_tokens=6_000, cache_write_tokens=2_000)
    assert from_openai(chat) == expected
    assert from_openai(responses) == expected
    # The SDK's objects read the same as the dicts (a None where the API left the field out).
    from openai.types import CompletionUsage
    from openai.types.responses import ResponseUsage

    assert from_openai(CompletionUsage.model_validate(chat | {"total_tokens": 10_300})) == expected
    sdk = ResponseUsage.model_validate(
        responses | {"total_tokens": 10_300, "output_tokens_details": {"reasoning_tokens": 0}}
    )
    assert from_openai(sdk) == expected


@pytest.mark.parametrize(
    ("counts", "field"),
    [
        (
            {"input_tokens": 10, "output_tokens": 0, "cached_input_tokens": 11},
            "cached_input_tokens",
        ),
        (
            {
                "input_tokens": 10,
                "output_tokens": 0,
                "cached_input_tokens": 6,
                "cache_write_tokens": 5,
            },
            "cached_input_tokens",
        ),
        (
            {
                "input_tokens": 10,
                "output_tokens": 0,
                "cache_write_tokens": 1,
                "cache_write_1h_tokens": 2,
            },
            "cache_write_1h_tokens",
        ),
        ({"input_tokens": 0, "output_tokens": 1, "reasoning_tokens": 2}, "reasoning_tokens"),
        ({"input_tokens": 0, "output_tokens": 0, "tool_calls": ["web_search"]}, "tool_calls"),
    ],
)
def test_parts_must_fit_in_their_totals(counts: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidUsage) as info:
        usage_validate(**counts)
    assert info.value.field == field


@pytest.mark.django_db
def test_both_shapes_charge_the_same_through_commit() -> None:
    budgets.set_price(
        provider="anthropic",
        model="claude-x",
        input_per_mtok="3",
        output_per_mtok="15",
        cached_input_per_mtok="0.3",
        cache_write_per_mtok="3.75",
        cache_write_1h_per_mtok="6",
        tool_fees={"web_search": "0.01"},
    )
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    results = []
    for commit in (
        lambda hold: hold.commit(usage=from_anthropic(ANTHROPIC)),
        lambda hold: hold.commit(
            input_tokens=10_000,
            output_tokens=300,
            cached_input_tokens=6_000,
            cache_write_tokens=2_000,
            cache_write_1h_tokens=500,
            tool_calls={"web_search": 2},
        ),
    ):
        hold = budgets.reserve(
            tenant="acme",
            model="claude-x",
            input_tokens=10_000,
            max_output_tokens=1_000,
            max_tool_calls={"web_search": 2},  # a commit may report no more than it held
        )
        results.append(commit(hold).cost)
    # 2000*3 + 6000*0.3 + 1500*3.75 + 500*6 + 300*15 per million, plus 2 searches
    expected = (Decimal(6000 + 1800 + 5625 + 3000 + 4500) / 1_000_000) + Decimal("0.02")
    assert results == [expected, expected]
    line = UsageRecord.objects.order_by("created_at").first()
    assert line is not None
    assert (line.input_tokens, line.cached_input_tokens, line.cache_write_tokens) == (
        10_000,
        6_000,
        2_000,
    )
    assert (line.cache_write_1h_tokens, line.tool_calls) == (500, {"web_search": 2})


def test_each_commit_takes_every_field_of_usage_as_a_keyword() -> None:
    """``usage_keywords(locals())``: Usage's fields among a commit's arguments, the others left
    out; a commit that lacks one is a KeyError, not a count silently dropped."""
    counts = Usage(input_tokens=3, output_tokens=2, tool_calls={"web_search": 1}).as_fields()
    assert usage_keywords({"self": None, "hold_id": "h", **counts, "usage": None}) == counts
    with pytest.raises(KeyError):
        usage_keywords({"input_tokens": 3, "output_tokens": 2})
