"""Fake OpenAI, Anthropic and Stripe servers: real HTTP servers on 127.0.0.1 (port 0) that the
real ``openai``, ``anthropic`` and ``stripe`` clients talk to, so a host tests its guarded views
offline (docs/testing.md). Standard library only; each starts a thread when created/started."""

from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import Behaviour, FakeProvider
from llm_budgets.testing.fakes.stripe_server import StripeServer

__all__ = ["Behaviour", "FakeAnthropic", "FakeOpenAI", "FakeProvider", "StripeServer"]
