from llm_budgets.testing.fakes.openai_server import DEFAULT_USAGE, FakeOpenAI

__all__ = ["DEFAULT_USAGE", "FakeOpenAI"]
