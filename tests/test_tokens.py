"""Offline token counting (issue 3 item 7): tiktoken without network, a bound for the others."""

from __future__ import annotations

from decimal import Decimal

import pytest
import tiktoken.load
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.pricing import tokens
from llm_budgets.pricing.tokens import count_input_tokens, encoding
from llm_budgets.usage import input_allowed

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "name": "ann", "content": [{"type": "text", "text": "hello world"}]},
]


@pytest.fixture
def no_tiktoken_download(no_network: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken tried to fetch an encoding file")

    monkeypatch.setattr(tiktoken.load, "read_file", never)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", never)
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    encoding.cache_clear()  # build the encodings inside the guard


def test_bundled_encodings_load_without_network_and_match_tiktoken(
    no_tiktoken_download: None, no_network: list[object]
) -> None:
    assert encoding("cl100k_base").encode("hello world") == [15339, 1917]
    assert encoding("o200k_base").encode("hello world") == [24912, 2375]
    assert no_network == []


def test_a_tampered_vocabulary_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tokens._ENCODINGS["cl100k_base"], "sha256", "0" * 64)
    with pytest.raises(tokens.EncodingUnavailable, match="does not match"):
        tokens._vocabulary("cl100k_base")


def test_openai_models_are_counted_exactly(no_tiktoken_download: None) -> None:
    assert count_input_tokens(provider="openai", model="gpt-4o", prompt="hello world") == 2
    # 3 per message + 1 for the name + 3 to prime the reply, plus the texts' tokens.
    expected = (
        3
        + 3
        + 1
        + 3
        + sum(
            len(encoding("o200k_base").encode(text))
            for text in ("system", "You are terse.", "user", "ann", "hello world")
        )
    )
    assert count_input_tokens(provider="openai", model="gpt-4o", messages=MESSAGES) == expected
    assert count_input_tokens(provider=None, model="gpt-4", prompt="hello world") == 2


def test_other_models_get_a_conservative_bound_with_the_safety_margin() -> None:
    text = "héllo wörld"  # 13 UTF-8 bytes
    assert count_input_tokens(provider="anthropic", model="claude-x", prompt=text) == 15  # x1.1
    with override_settings(LLM_BUDGETS={"TOKEN_ESTIMATE_SAFETY_MARGIN": "2"}):
        assert count_input_tokens(provider="anthropic", model="claude-x", prompt=text) == 26
    exact = count_input_tokens(provider="openai", model="gpt-4o", messages=MESSAGES)
    bound = count_input_tokens(provider="anthropic", model="gpt-4o", messages=MESSAGES)
    assert bound > exact


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"prompt": 12}, "prompt"),
        ({"messages": MESSAGES, "prompt": "x"}, "messages"),
    ],
)
def test_uncountable_prompts_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidUsage) as info:
        count_input_tokens(provider="openai", model="gpt-4o", **kwargs)
    assert info.value.field == field


@pytest.mark.django_db
def test_reserve_counts_messages_itself(no_tiktoken_download: None) -> None:
    budgets.set_price(provider="openai", model="gpt-4o", input_per_mtok="1", output_per_mtok="0")
    budgets.ensure_tenant(tenant="acme")
    budgets.set_limit(tenant="acme", amount=Decimal(1), window="month")
    hold = budgets.reserve(tenant="acme", model="gpt-4o", messages=MESSAGES, max_output_tokens=1)
    expected = count_input_tokens(provider="openai", model="gpt-4o", messages=MESSAGES)
    assert hold.reservation.input_tokens == expected
    assert hold.amount == Decimal(input_allowed(expected)) / 1_000_000  # with the tolerance
    hold.release()
    with pytest.raises(InvalidUsage, match="not both"):
        budgets.reserve(
            tenant="acme",
            model="gpt-4o",
            input_tokens=5,
            prompt="hi",
            max_output_tokens=1,
        )


def test_a_text_counted_before_is_not_counted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's largest cost of its own is counting (docs/performance.md): a long text seen
    before (a system prompt, a chat's history) is answered from a cache of counts kept by digest,
    with the count tiktoken gives, special tokens' text counted as plain text."""
    cache = tokens.CountCache(size=2)
    monkeypatch.setattr(tokens, "COUNTS", cache)
    enc = encoding("o200k_base")
    encoded: list[str] = []
    real = enc.encode_ordinary
    monkeypatch.setattr(enc, "encode_ordinary", lambda text: encoded.append(text) or real(text))
    history = "The customer asked about <|endoftext|> invoices. " * 20
    expected = len(enc.encode(history, disallowed_special=()))
    messages = [{"role": "user", "content": history}]
    first = count_input_tokens(provider="openai", model="gpt-4o", messages=messages)
    assert first == 3 + 3 + len(enc.encode("user")) + expected
    assert encoded.count(history) == 1
    assert count_input_tokens(provider="openai", model="gpt-4o", messages=messages) == first
    assert count_input_tokens(provider="openai", model="gpt-4o", prompt=history) == expected
    assert encoded.count(history) == 1  # answered from the cache twice
    assert all(isinstance(digest, bytes) for _, digest in cache._counts)  # no text kept
    for other in ("a" * 300, "b" * 300):  # two more long texts push the first one out
        count_input_tokens(provider="openai", model="gpt-4o", prompt=other)
    assert len(cache._counts) == 2
    count_input_tokens(provider="openai", model="gpt-4o", prompt=history)
    assert encoded.count(history) == 2


def test_a_streams_deltas_are_counted_as_the_prompt_would_be() -> None:
    for provider, model in (("openai", "gpt-4o"), ("anthropic", "claude-3-5-haiku-latest")):
        count = tokens.text_counter(provider, model)
        for text in ("Hello", " world, <|endoftext|>", "é" * 40):
            assert count(text) == count_input_tokens(provider=provider, model=model, prompt=text)
