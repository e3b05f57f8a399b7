from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.jobs.reconcile import allowances_excess, counters_drift


class Command(BaseCommand):
    help = (
        "Verify conservation: every counter's spent and reserved against the ledger and live "
        "holds; "
        "and that a hot budget's stripes cannot admit past its limit (the allowance invariant)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        drift = counters_drift()
        excess = allowances_excess()
        for item in [*drift, *excess]:
            self.stderr.write(str(item))
        if drift or excess:
            raise CommandError(
                f"{len(drift)} counter total(s) drift from the ledger; "
                f"{len(excess)} striped counter(s) break the allowance invariant."
            )
        self.stdout.write(
            "Every counter agrees with the ledger and its live holds; every striped counter "
            "keeps its allowance invariant."
        )
