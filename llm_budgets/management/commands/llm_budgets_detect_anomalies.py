from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.jobs.anomalies import anomalies_detect
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import DETECT_ANOMALIES


class Command(BaseCommand):
    help = (
        "Trip kill switches on spend velocity, runaway loops and failure storms, with each "
        "plan's thresholds. Run every minute (cron or Celery beat)."
    )

    @job_recorded(DETECT_ANOMALIES.task)
    def handle(self, *args: Any, **options: Any) -> None:
        tripped = anomalies_detect()
        for switch in tripped:
            self.stdout.write(f"Tripped {switch.scope_label}: {switch.reason}")
        self.stdout.write(f"{len(tripped)} kill switch(es) tripped.")
