"""The periodic jobs' work, called by the Celery tasks in ``llm_budgets.tasks``: warnings, rollups,
retention, anomalies, counter reconciliation, and the record of job runs."""
