from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.billing.credit_reconciliation import BalanceReport, credits_reconcile
from llm_budgets.money import display


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
        bad = reported(self.stdout.write, reports)
        if bad:
            raise CommandError(f"{bad} difference(s) in {len(reports)} balance(s).")


def reported(write: Callable[[str], object], reports: list[BalanceReport]) -> int:
    """Write each balance's line and its differences; returns how many differences."""
    bad = 0
    for report in reports:
        stripe = (
            ""
            if report.stripe_available is None
            else f", Stripe available {display(report.stripe_available)}"
        )
        write(
            f"{report.tenant}: credit {display(report.credit)}, available "
            f"{display(report.available)}{stripe}: "
            + ("clean" if not report.differences else f"{len(report.differences)} difference(s)")
        )
        for difference in report.differences:
            write(f"  {difference}")
        bad += len(report.differences)
    return bad
