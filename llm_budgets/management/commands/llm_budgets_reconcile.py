from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.reconcile import counters_drift


class Command(BaseCommand):
    help = (
        "Verify conservation: every counter's spent and reserved against the ledger and live holds."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        drift = counters_drift()
        for item in drift:
            self.stderr.write(str(item))
        if drift:
            raise CommandError(f"{len(drift)} counter total(s) drift from the ledger.")
        self.stdout.write("Every counter agrees with the ledger and its live holds.")
