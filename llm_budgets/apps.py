from __future__ import annotations

from django.apps import AppConfig


class LlmBudgetsConfig(AppConfig):
    name = "llm_budgets"
    verbose_name = "LLM budgets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from llm_budgets import checks  # noqa: F401  (registers the system checks)
