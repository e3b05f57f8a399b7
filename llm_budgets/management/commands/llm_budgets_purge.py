from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from llm_budgets.retention import reservations_purge


class Command(BaseCommand):
    help = (
        "Delete reservations that ended without a charge more than RETENTION_RELEASED_DAYS ago. "
        "Ledger lines, and reservations they refer to, are never deleted."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        purged = reservations_purge()
        self.stdout.write(f"Purged {purged} uncharged reservation(s).")
