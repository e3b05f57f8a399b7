from llm_budgets.testing.fakes.anthropic_server import DEFAULT_USAGE, FakeAnthropic

__all__ = ["DEFAULT_USAGE", "FakeAnthropic"]
