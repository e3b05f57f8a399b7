from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.engine.settlement import reservations_sweep
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import SWEEP_EXPIRED_HOLDS


class Command(BaseCommand):
    help = "Expire overdue holds (charged as estimated spend, or released: EXPIRED_HOLD_POLICY)."

    @job_recorded(SWEEP_EXPIRED_HOLDS.task)
    def handle(self, *args: Any, **options: Any) -> None:
        expired = reservations_sweep()
        self.stdout.write(f"Expired {expired} overdue hold(s).")
