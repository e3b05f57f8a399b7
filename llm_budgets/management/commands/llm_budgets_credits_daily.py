from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.billing.credits_daily import credits_daily
from llm_budgets.jobs.records import job_recorded
from llm_budgets.management.commands.llm_budgets_credits_reconcile import reported
from llm_budgets.schedule import CREDITS_DAILY


class Command(BaseCommand):
    help = (
        "The prepaid balances' daily job, in this process: expire the credit lots that are due; "
        "with STRIPE_API_KEY, bring the Stripe grants in step and reconcile each balance with "
        "Stripe (exit 1 on a difference)."
    )

    @job_recorded(CREDITS_DAILY.task)
    def handle(self, *args: Any, **options: Any) -> None:
        reports = credits_daily()
        bad = reported(self.stdout.write, reports)
        if bad:
            raise CommandError(f"{bad} difference(s) in {len(reports)} balance(s).")
