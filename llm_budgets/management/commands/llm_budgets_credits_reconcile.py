from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.billing.credit_reconciliation import credits_reconcile
from llm_budgets.jobs.records import job_recorded
from llm_budgets.money import display
from llm_budgets.schedule import CREDITS_DAILY


class Command(BaseCommand):
    help = (
        "Compare each prepaid balance with its lots, its top-ups and the tenant's Stripe credit "
        "grants and credit balance summary; report differences to the cent. Exit 1 if any."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", help="Only this tenant (repeatable).")

    @job_recorded(CREDITS_DAILY.task)
    def handle(self, *args: Any, **options: Any) -> None:
        reports = credits_reconcile(tenants=options["tenant"])
        bad = 0
        for report in reports:
            stripe = (
                ""
                if report.stripe_available is None
                else f", Stripe available {display(report.stripe_available)}"
            )
            self.stdout.write(
                f"{report.tenant}: credit {display(report.credit)}, available "
                f"{display(report.available)}{stripe}: "
                + (
                    "clean"
                    if not report.differences
                    else f"{len(report.differences)} difference(s)"
                )
            )
            for difference in report.differences:
                self.stdout.write(f"  {difference}")
            bad += len(report.differences)
        if bad:
            raise CommandError(f"{bad} difference(s) in {len(reports)} balance(s).")
