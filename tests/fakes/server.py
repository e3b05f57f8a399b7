from llm_budgets.testing.fakes.server import WAIT, Behaviour, FakeProvider, Seen

__all__ = ["WAIT", "Behaviour", "FakeProvider", "Seen"]
