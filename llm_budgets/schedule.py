"""Every periodic job declared once, as a :class:`Job`, and the schedules derived from the
declarations. One path per scheduler (docs/operations.md, "Wiring the schedule"):

- Celery's static beat: merge the ready dict into the Celery configuration::

    from llm_budgets.schedule import BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE, **your_own}

- django-celery-beat's DatabaseScheduler: ``manage.py llm_budgets_install_schedule`` writes the
  same entries as editable rows (``periodic_tasks_install``). Never merge the dict as well: that
  scheduler rewrites its rows from ``CELERY_BEAT_SCHEDULE`` at every beat start.

Each entry expires after one interval, so a backlog built while workers were down collapses to the
next run instead of piling up.

An app declares its jobs in a module of its own (this app's: ``JOBS`` below) and names that
sequence in its ``AppConfig.llm_budgets_jobs``; ``jobs_installed`` collects the jobs of the
installed apps, which the schedule install, the system checks and ``/health`` go by. The Celery
task of a job takes its name from the declaration (``tasks.job_task``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DAY = 24 * 60 * 60


@dataclass(frozen=True)
class Job:
    """One periodic job. ``name`` is its beat entry's (and periodic task row's) name, ``task`` its
    Celery task's, both stored in hosts' beat databases: never rename either. ``needs`` names an
    optional part without which the job has nothing to do (``"stripe"``: ``STRIPE_API_KEY``)."""

    name: str
    task: str
    every: int  # seconds, the default interval
    purpose: str
    needs: str = ""

    def beat_entry(self) -> dict[str, Any]:
        seconds = float(self.every)
        return {"task": self.task, "schedule": seconds, "options": {"expires": seconds}}


SWEEP_EXPIRED_HOLDS = Job(
    "llm_budgets: expire overdue holds",
    "llm_budgets.sweep_expired_holds",
    30,
    "Expire held reservations past their expiry, freeing the budget they hold.",
)
RECONCILE_UNCERTAIN = Job(
    "llm_budgets: settle uncertain reservations",
    "llm_budgets.reconcile_uncertain",
    5 * 60,
    "Settle reservations whose outcome stayed unknown past UNCERTAIN_MAX_AGE_SECONDS.",
)
SCAN_THRESHOLDS = Job(
    "llm_budgets: warning thresholds",
    "llm_budgets.scan_thresholds",
    60,
    "Record budgets that reached a warning threshold and email their tenants.",
)
DETECT_ANOMALIES = Job(
    "llm_budgets: automatic kill switches",
    "llm_budgets.detect_anomalies",
    60,
    "Trip kill switches on runaway spend, loops and failure storms.",
)
ROLLUP_DAILY_USAGE = Job(
    "llm_budgets: daily usage rollups",
    "llm_budgets.rollup_daily_usage",
    15 * 60,
    "Rebuild the daily usage rollups of the last days from the ledger.",
)
PURGE_RETENTION = Job(
    "llm_budgets: retention purge",
    "llm_budgets.purge_retention",
    DAY,
    "Delete old uncharged reservations and refusal records.",
)
STRIPE_PUSH = Job(
    "llm_budgets: stripe usage delivery",
    "llm_budgets.stripe_push",
    60,
    "Deliver metered usage to Stripe.",
    needs="stripe",
)
STRIPE_RECONCILE = Job(
    "llm_budgets: stripe reconciliation",
    "llm_budgets.stripe_reconcile",
    DAY,
    "Compare delivered usage with Stripe's meter event summaries.",
    needs="stripe",
)
CREDITS_DAILY = Job(
    "llm_budgets: prepaid expiry and reconciliation",
    "llm_budgets.credits_daily",
    DAY,
    "Expire due credit lots, then reconcile prepaid balances with Stripe.",
)
RECHARGES_SEND = Job(
    "llm_budgets: prepaid auto-recharge",
    "llm_budgets.recharges_send",
    60,
    "Pay pending prepaid auto-recharges off-session.",
    needs="stripe",
)
DELIVER_ALERTS = Job(
    "llm_budgets: alert delivery",
    "llm_budgets.deliver_alerts",
    10,  # alerts wait at most this long for their first attempt (docs/alerts.md)
    "Send the alert outbox to its endpoints.",
)

# This app's jobs (``LlmBudgetsConfig.llm_budgets_jobs``).
JOBS: tuple[Job, ...] = (
    SWEEP_EXPIRED_HOLDS,
    RECONCILE_UNCERTAIN,
    SCAN_THRESHOLDS,
    DETECT_ANOMALIES,
    ROLLUP_DAILY_USAGE,
    PURGE_RETENTION,
    STRIPE_PUSH,
    STRIPE_RECONCILE,
    CREDITS_DAILY,
    RECHARGES_SEND,
    DELIVER_ALERTS,
)


def beat_schedule(jobs: Iterable[Job]) -> dict[str, dict[str, Any]]:
    """``jobs`` as entries of Celery's ``beat_schedule``, each expiring after one interval."""
    return {job.name: job.beat_entry() for job in jobs}


BEAT_SCHEDULE: dict[str, dict[str, Any]] = beat_schedule(JOBS)


def jobs_installed() -> tuple[Job, ...]:
    """The jobs of every installed app that declares some: the sequence its AppConfig's
    ``llm_budgets_jobs`` names by dotted path."""
    from django.apps import apps
    from django.utils.module_loading import import_string

    found: list[Job] = []
    for config in apps.get_app_configs():
        path = getattr(config, "llm_budgets_jobs", "")
        if path:
            found.extend(import_string(path))
    return tuple(found)


def jobs_expected(*, stripe: bool) -> tuple[Job, ...]:
    """The installed jobs that have something to do: those that need Stripe only with a key."""
    parts = {"stripe"} if stripe else set()
    return tuple(job for job in jobs_installed() if not job.needs or job.needs in parts)


def periodic_tasks_install() -> list[str]:
    """Create the installed apps' schedule as django-celery-beat rows, editable in the admin. Rows
    that exist are left as they are (an operator may have edited them). Returns the names
    created."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    created = []
    for job in jobs_installed():
        every, _ = IntervalSchedule.objects.get_or_create(
            every=job.every, period=IntervalSchedule.SECONDS
        )
        _, was_created = PeriodicTask.objects.get_or_create(
            name=job.name,
            defaults={
                "task": job.task,
                "interval": every,
                "expire_seconds": job.every,
                "description": job.purpose,
            },
        )
        if was_created:
            created.append(job.name)
    return created
