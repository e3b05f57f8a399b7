from llm_budgets.testing.fakes.stripe_server import MeterEvent, StripeServer, parse_form

__all__ = ["MeterEvent", "StripeServer", "parse_form"]
