from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.billing.credit_reconciliation import BalanceReport, reports_written
from llm_budgets.billing.credits_daily import credits_daily
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import CREDITS_DAILY


class Command(BaseCommand):
    help = (
        "The prepaid balances' daily job, in this process: expire the credit lots that are due; "
        "with STRIPE_API_KEY, bring the Stripe grants in step and reconcile each balance with "
        "Stripe. Exit 1 on a difference (the job itself is recorded as run, as its task is)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        reports = _daily()
        bad = reports_written(self.stdout.write, reports)
        if bad:
            raise CommandError(f"{bad} difference(s) in {len(reports)} balance(s).")


@job_recorded(CREDITS_DAILY.task)
def _daily() -> list[BalanceReport]:
    return credits_daily()
