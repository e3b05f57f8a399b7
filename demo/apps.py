from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demonstration behind ``make demo``: not part of llm_budgets, only of the demo project."""

    name = "demo"
    label = "llm_budgets_demo"
