from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.billing.recharge import recharges_send
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import RECHARGES_SEND


class Command(BaseCommand):
    help = (
        "Pay the pending prepaid auto-recharges off-session, in this process (nothing without "
        "STRIPE_API_KEY: they wait)."
    )

    @job_recorded(RECHARGES_SEND.task)
    def handle(self, *args: Any, **options: Any) -> None:
        counts = recharges_send()
        self.stdout.write(
            "Auto-recharges: "
            + ", ".join(f"{count} {outcome}" for outcome, count in counts.items())
        )
