from __future__ import annotations

from django.apps import AppConfig

# Apps llm_budgets' models and API import: without them loading fails with a traceback about
# another app's model, so say which is missing before that (the rest are system checks:
# 'rest_framework_api_key' is E092, its models' base stands in until it is added).
REQUIRED_APPS = (
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
)


class LlmBudgetsConfig(AppConfig):
    name = "llm_budgets"
    verbose_name = "LLM budgets"
    default_auto_field = "django.db.models.BigAutoField"
    # The app's periodic jobs (``schedule.jobs_installed``).
    llm_budgets_jobs = "llm_budgets.schedule.JOBS"

    def import_models(self) -> None:
        from django.apps import apps
        from django.core.exceptions import ImproperlyConfigured

        missing = [name for name in REQUIRED_APPS if not apps.is_installed(name)]
        if missing:
            raise ImproperlyConfigured(
                f"llm_budgets needs {', '.join(map(repr, missing))} in INSTALLED_APPS (add those "
                "you lack; see the README, 'Adding it to your project')."
            )
        super().import_models()

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from llm_budgets import checks  # noqa: F401  (registers the system checks)
        from llm_budgets.alerts import checks as alerts_checks  # noqa: F401  (E110, W111)
        from llm_budgets.api.authentication import key_cache_watch
        from llm_budgets.billing import checks as billing_checks  # noqa: F401  (W070)
        from llm_budgets.conf import settings_watch
        from llm_budgets.db.ledger import configuration_watch, ledger_database_install
        from llm_budgets.pages import checks as pages_checks  # noqa: F401  (W085, E086)
        from llm_budgets.roles import roles_sync

        settings_watch()
        ledger_database_install()
        configuration_watch()
        ledger_parts_register()
        key_cache_watch()

        post_migrate.connect(roles_sync, sender=self, dispatch_uid="llm_budgets.roles_sync")

        from llm_budgets import events, signals

        for signal in (signals.kill_switch_tripped, signals.kill_switch_cleared):
            signal.connect(events.kill_switch_logged, dispatch_uid="llm_budgets.events")


def ledger_parts_register() -> None:
    """The parts that write in the ledger's transactions (``llm_budgets.hooks``): Stripe's outbox
    and recharges, the alert events. Each moves to its own app's ``ready()`` when it becomes one."""
    from llm_budgets.alerts.ledger_hooks import AlertHooks
    from llm_budgets.billing.ledger_hooks import StripeHooks
    from llm_budgets.hooks import hooks_register

    hooks_register("stripe", StripeHooks())
    hooks_register("alerts", AlertHooks())
