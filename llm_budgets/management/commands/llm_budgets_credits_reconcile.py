from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.billing.credit_reconciliation import credits_reconcile, reports_written


class Command(BaseCommand):
    help = (
        "Compare each prepaid balance with its lots, its top-ups and the tenant's Stripe credit "
        "grants and credit balance summary; report differences to the cent. Exit 1 if any. "
        "A report only: llm_budgets_credits_daily runs the whole daily job."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", help="Only this tenant (repeatable).")

    def handle(self, *args: Any, **options: Any) -> None:
        reports = credits_reconcile(tenants=options["tenant"])
        bad = reports_written(self.stdout.write, reports)
        if bad:
            raise CommandError(f"{bad} difference(s) in {len(reports)} balance(s).")
