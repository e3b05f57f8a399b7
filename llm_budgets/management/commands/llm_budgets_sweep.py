from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.engine.settlement import reservations_sweep
from llm_budgets.jobs.records import job_recorded


class Command(BaseCommand):
    help = "Expire overdue holds (charged as estimated spend, or released: EXPIRED_HOLD_POLICY)."

    @job_recorded("llm_budgets.sweep_expired_holds")
    def handle(self, *args: Any, **options: Any) -> None:
        expired = reservations_sweep()
        self.stdout.write(f"Expired {expired} overdue hold(s).")
