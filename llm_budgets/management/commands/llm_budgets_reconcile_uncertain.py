from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.engine.settlement import reservations_reconcile
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import RECONCILE_UNCERTAIN


class Command(BaseCommand):
    help = (
        "Settle UNCERTAIN reservations older than UNCERTAIN_MAX_AGE_SECONDS by "
        "UNCERTAIN_SETTLE_RULE (charge the hold as estimated, or release it)."
    )

    @job_recorded(RECONCILE_UNCERTAIN.task)
    def handle(self, *args: Any, **options: Any) -> None:
        settled = reservations_reconcile()
        self.stdout.write(f"Settled {settled} uncertain reservation(s).")
