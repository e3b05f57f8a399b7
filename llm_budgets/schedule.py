"""The default beat schedule. One path per scheduler (docs/operations.md, "Wiring the schedule"):

- Celery's static beat: merge the ready dict into the Celery configuration::

    from llm_budgets.schedule import BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE, **your_own}

- django-celery-beat's DatabaseScheduler: ``manage.py llm_budgets_install_schedule`` writes the
  same entries as editable rows (``periodic_tasks_install``). Never merge the dict as well: that
  scheduler rewrites its rows from ``CELERY_BEAT_SCHEDULE`` at every beat start.

Each entry expires after one interval, so a backlog built while workers were down collapses to the
next run instead of piling up.
"""

from __future__ import annotations

from typing import Any

# name -> (task, every N seconds)
JOBS: dict[str, tuple[str, int]] = {
    "llm_budgets: expire overdue holds": ("llm_budgets.sweep_expired_holds", 30),
    "llm_budgets: settle uncertain reservations": ("llm_budgets.reconcile_uncertain", 300),
    "llm_budgets: warning thresholds": ("llm_budgets.scan_thresholds", 60),
    "llm_budgets: automatic kill switches": ("llm_budgets.detect_anomalies", 60),
    "llm_budgets: daily usage rollups": ("llm_budgets.rollup_daily_usage", 15 * 60),
    "llm_budgets: retention purge": ("llm_budgets.purge_retention", 24 * 60 * 60),
    "llm_budgets: stripe usage delivery": ("llm_budgets.stripe_push", 60),
    "llm_budgets: stripe reconciliation": ("llm_budgets.stripe_reconcile", 24 * 60 * 60),
    "llm_budgets: prepaid expiry and reconciliation": ("llm_budgets.credits_daily", 24 * 60 * 60),
    "llm_budgets: prepaid auto-recharge": ("llm_budgets.recharges_send", 60),
    # Alerts wait at most this long for their first attempt (docs/alerts.md).
    "llm_budgets: alert delivery": ("llm_budgets.deliver_alerts", 10),
}

# Jobs with nothing to do without a Stripe key (health does not expect them to run).
STRIPE_TASKS = frozenset(
    {"llm_budgets.stripe_push", "llm_budgets.stripe_reconcile", "llm_budgets.recharges_send"}
)
TASKS = frozenset(task for task, _ in JOBS.values())

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    name: {"task": task, "schedule": float(seconds), "options": {"expires": float(seconds)}}
    for name, (task, seconds) in JOBS.items()
}


def periodic_tasks_install() -> list[str]:
    """Create the default schedule as django-celery-beat rows, editable in the admin. Rows that
    exist are left as they are (an operator may have edited them). Returns the names created."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    created = []
    for name, (task, seconds) in JOBS.items():
        every, _ = IntervalSchedule.objects.get_or_create(
            every=seconds, period=IntervalSchedule.SECONDS
        )
        _, was_created = PeriodicTask.objects.get_or_create(
            name=name, defaults={"task": task, "interval": every, "expire_seconds": seconds}
        )
        if was_created:
            created.append(name)
    return created
