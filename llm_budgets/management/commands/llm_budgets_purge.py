from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.jobs.records import job_recorded
from llm_budgets.jobs.retention import refusals_purge, reservations_purge
from llm_budgets.schedule import PURGE_RETENTION


class Command(BaseCommand):
    help = (
        "Delete reservations that ended without a charge more than RETENTION_RELEASED_DAYS ago, "
        "and refusal records older than RETENTION_REFUSALS_DAYS. Ledger lines, and reservations "
        "they refer to, are never deleted."
    )

    @job_recorded(PURGE_RETENTION.task)
    def handle(self, *args: Any, **options: Any) -> None:
        purged = reservations_purge()
        refusals = refusals_purge()
        self.stdout.write(
            f"Purged {purged} uncharged reservation(s) and {refusals} refusal record(s)."
        )
