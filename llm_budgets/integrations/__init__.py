"""Guarded clients for provider SDKs: ``llm_budgets.integrations.openai.guard`` and
``llm_budgets.integrations.anthropic.guard`` (each needs its SDK: the ``openai`` / ``anthropic``
extras), and ``llm_budgets.integrations.django.stream_response`` for a view that streams a
guarded completion. See docs/integrations.md."""
