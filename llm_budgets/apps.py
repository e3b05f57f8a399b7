from __future__ import annotations

from django.apps import AppConfig


class LlmBudgetsConfig(AppConfig):
    name = "llm_budgets"
    verbose_name = "LLM budgets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from llm_budgets import checks  # noqa: F401  (registers the system checks)
        from llm_budgets.roles import roles_sync

        post_migrate.connect(roles_sync, sender=self, dispatch_uid="llm_budgets.roles_sync")

        from llm_budgets import events, signals

        for signal in (signals.kill_switch_tripped, signals.kill_switch_cleared):
            signal.connect(events.kill_switch_logged, dispatch_uid="llm_budgets.events")
