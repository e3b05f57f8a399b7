from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.alerts.delivery import alerts_deliver
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import DELIVER_ALERTS


class Command(BaseCommand):
    help = (
        "Send the alert deliveries that are due now, in this process (each endpoint's in order). "
        "Safe to run twice or in several processes at once."
    )

    @job_recorded(DELIVER_ALERTS.task)
    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"Alerts: {alerts_deliver()}.")
