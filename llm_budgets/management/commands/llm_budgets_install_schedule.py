from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand

from llm_budgets.checks import beat_schedule_tasks
from llm_budgets.schedule import periodic_tasks_install


class Command(BaseCommand):
    help = (
        "Create the default job schedule as django-celery-beat periodic tasks (editable in the "
        "admin); existing rows are left as they are."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not apps.is_installed("django_celery_beat"):
            # Not an error: the host schedules from the ready dict (or cron) instead.
            self.stderr.write(
                "django-celery-beat is not installed: nothing to do. Merge "
                "llm_budgets.schedule.BEAT_SCHEDULE into CELERY_BEAT_SCHEDULE instead."
            )
            return
        if beat_schedule_tasks():
            # DatabaseScheduler would rewrite these rows from the setting at every beat start.
            self.stderr.write(
                "Warning (llm_budgets.W080): llm_budgets' jobs are also in CELERY_BEAT_SCHEDULE; "
                "under django-celery-beat's DatabaseScheduler beat rewrites the rows from it at "
                "every start, undoing admin edits. Remove BEAT_SCHEDULE from "
                "CELERY_BEAT_SCHEDULE (docs/operations.md, 'Wiring the schedule')."
            )
        created = periodic_tasks_install()
        self.stdout.write(f"Created {len(created)} periodic task(s).")
