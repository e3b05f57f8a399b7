from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.schedule import periodic_tasks_install


class Command(BaseCommand):
    help = (
        "Create the default job schedule as django-celery-beat periodic tasks (editable in the "
        "admin); existing rows are left as they are."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            created = periodic_tasks_install()
        except ImportError as exc:
            raise CommandError(
                "django-celery-beat is not installed; merge llm_budgets.schedule.BEAT_SCHEDULE "
                "into CELERY_BEAT_SCHEDULE instead."
            ) from exc
        self.stdout.write(f"Created {len(created)} periodic task(s).")
