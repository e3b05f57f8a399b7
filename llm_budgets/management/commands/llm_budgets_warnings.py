from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.jobs.records import job_recorded
from llm_budgets.jobs.thresholds import threshold_warning_send, thresholds_due, thresholds_scan
from llm_budgets.schedule import SCAN_THRESHOLDS


class Command(BaseCommand):
    help = (
        "Record warning thresholds reached in current periods, then email every warning that is "
        "due (once per budget, period and threshold)."
    )

    @job_recorded(SCAN_THRESHOLDS.task)
    def handle(self, *args: Any, **options: Any) -> None:
        created = thresholds_scan()
        states = [threshold_warning_send(crossing_id) for crossing_id in thresholds_due()]
        self.stdout.write(
            f"{len(created)} new crossing(s); {states.count('sent')} warning email(s) sent."
        )
