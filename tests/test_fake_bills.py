"""The bill calculator the differential harness trusts (llm_budgets/testing/fakes/bills.py),
checked against figures worked by hand from the providers' published rules."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llm_budgets.testing.fakes import bills
from tests.guard_corpus import pdf, png


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        ((4000, 4000), "low", 85),  # low detail is a fixed 85, whatever the size
        ((1024, 1024), "high", 765),  # 768 x 768: 2 x 2 tiles -> 85 + 4 * 170
        ((2048, 4096), "high", 1105),  # 1024 x 2048, then 768 x 1536: 2 x 3 tiles
        ((512, 512), "auto", 255),  # never scaled up: one tile
    ],
)
def test_openai_image_tokens_follow_the_tile_rule(
    size: tuple[int, int], detail: str, tokens: int
) -> None:
    assert bills.openai_image_tokens(*size, detail) == tokens


def test_anthropic_image_tokens_are_pixels_over_750_after_the_resize() -> None:
    assert bills.anthropic_image_tokens(750, 1000) == 1000
    # 3000 x 3000 is scaled to about 1.15 megapixels: 1,150,000 / 750
    assert bills.anthropic_image_tokens(3000, 3000) == 1534


def test_an_inline_pngs_size_is_read_from_its_header() -> None:
    assert bills.image_size(f"data:image/png;base64,{png(1600, 1200)}", {}) == (1600, 1200)
    assert bills.image_size("https://example.com/x.png", {}) == bills.REMOTE_IMAGE_SIZE


def test_a_priority_call_is_billed_at_the_priority_rates() -> None:
    usage = bills.Usage(input_tokens=1_000_000, cached_input_tokens=200_000, output_tokens=100_000)
    standard = bills.bill("openai", "gpt-4o", usage)
    priority = bills.bill("openai", "gpt-4o", usage, modifiers=("priority",))
    # 800k x 2.50 + 200k x 1.25 + 100k x 10 per million
    assert standard.total == Decimal("3.25")
    # 800k x 4.25 + 200k x 2.125 + 100k x 17 per million
    assert priority.total == Decimal("5.525")
    assert priority.tier == "priority"


def test_flex_without_listed_rates_is_half_and_with_them_its_own() -> None:
    usage = bills.Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert bills.bill("openai", "gpt-5", usage, modifiers=("flex",)).total == Decimal("5.625")
    assert bills.bill("openai", "gpt-4o", usage, modifiers=("flex",)).total == Decimal("6.25")


def test_anthropic_fast_and_us_inference_multiply_every_rate() -> None:
    usage = bills.Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert bills.bill("anthropic", "claude-opus-4-6", usage).total == Decimal(30)
    fast = bills.bill("anthropic", "claude-opus-4-6", usage, modifiers=("fast",))
    assert fast.total == Decimal(180)  # 30 in + 150 out
    both = bills.bill("anthropic", "claude-opus-4-6", usage, modifiers=("fast", "geo_us"))
    assert both.total == Decimal("198.0")
    assert both.tier == "fast+geo_us"


def test_anthropic_cache_reads_and_writes_and_long_context() -> None:
    usage = bills.Usage(
        input_tokens=400_000,
        cached_input_tokens=100_000,
        cache_write_tokens=100_000,
        cache_write_1h_tokens=100_000,
    )
    # Sonnet above 200k input: every token at the long-context rates (6 in; 0.6 read;
    # 7.5 5-minute write; 12 1-hour write).
    assert bills.bill("anthropic", "claude-sonnet-4-5", usage).total == Decimal("2.61")
    short = bills.Usage(input_tokens=100_000, cached_input_tokens=100_000)
    assert bills.bill("anthropic", "claude-sonnet-4-5", short).total == Decimal("0.03")


def test_audio_tokens_and_server_tool_fees_are_billed_at_their_own_rates() -> None:
    usage = bills.Usage(
        input_tokens=1_000,
        audio_input_tokens=1_000,
        output_tokens=2_000,
        audio_output_tokens=1_000,
        tool_calls={"web_search": 3},
    )
    billed = bills.bill("openai", "gpt-4o-audio-preview", usage)
    assert billed.items == {
        "audio_input": Decimal("0.04"),
        "output": Decimal("0.01"),
        "audio_output": Decimal("0.08"),
        "tool:web_search": Decimal("0.03"),
    }


def test_chat_input_counts_the_documented_overhead() -> None:
    """3 tokens a message, the role and content, 3 to prime the reply (OpenAI's cookbook)."""
    body = {"messages": [{"role": "user", "content": "hello"}]}
    assert bills.openai_chat_input(body, {}).total == 3 + 3 + 1 + 1


def test_a_pdf_is_billed_by_its_pages() -> None:
    assert bills.pdf_pages(pdf(3)) == 3
    # Each page: 3,000 text tokens and the page image at the 1.15-megapixel cap (1,534).
    assert bills.anthropic_pdf_tokens(pdf(2)) == 2 * (3_000 + 1_534)
