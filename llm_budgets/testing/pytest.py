"""pytest fixtures for a host's own tests. Opt in, in the host's ``conftest.py``::

    pytest_plugins = ["llm_budgets.testing.pytest"]

No entry point registers it: a host that never asks gets no fixtures and no import of its
test-only code. ``llmb_setup`` needs pytest-django (its ``db`` fixture); the others do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_budgets.testing.clock import application_clock
from llm_budgets.testing.fakes import FakeAnthropic, FakeOpenAI, StripeServer
from llm_budgets.testing.setup import Seeded, setup_budgets


@pytest.fixture
def llmb_clock() -> Iterator[None]:
    """Admission follows this process's clock for the test: ``freezegun`` / ``time_machine``
    move the budgets' windows and resets too."""
    with application_clock():
        yield


@pytest.fixture
def llmb_setup(db: None) -> Callable[..., Seeded]:
    """``llmb_setup(tenants, limit=..., ...)``: :func:`llm_budgets.testing.setup_budgets`."""
    return setup_budgets


@pytest.fixture
def llmb_fake_openai(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """A fake OpenAI API; ``openai.OpenAI()`` created in the test (the host's view included)
    talks to it (``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` point there)."""
    fake = FakeOpenAI()
    monkeypatch.setenv("OPENAI_BASE_URL", f"{fake.base_url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-llmb-fake")
    yield fake
    fake.stop()


@pytest.fixture
def llmb_fake_anthropic(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    """A fake Anthropic API; ``anthropic.Anthropic()`` created in the test talks to it."""
    fake = FakeAnthropic()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-llmb-fake")
    yield fake
    fake.stop()


@pytest.fixture
def llmb_fake_stripe(settings: Any) -> Iterator[StripeServer]:
    """A fake Stripe API with real state; ``LLM_BUDGETS["STRIPE_API_BASE"]`` points at it and
    ``STRIPE_API_KEY`` is set (needs pytest-django's ``settings``)."""
    with StripeServer() as fake:
        settings.LLM_BUDGETS = {
            **getattr(settings, "LLM_BUDGETS", {}),
            "STRIPE_API_KEY": "sk_test_llmb_fake",
            "STRIPE_API_BASE": fake.base_url,
        }
        yield fake
