from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.alerts.delivery import alerts_deliver
from llm_budgets.jobs.records import job_recorded


class Command(BaseCommand):
    help = (
        "Send the alert deliveries that are due now, in this process (each endpoint's in order). "
        "Safe to run twice or in several processes at once."
    )

    @job_recorded("llm_budgets.deliver_alerts")
    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"Alerts: {alerts_deliver()}.")
