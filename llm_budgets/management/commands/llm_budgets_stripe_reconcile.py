from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.billing.reconciliation import billing_reconcile
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import STRIPE_RECONCILE


class Command(BaseCommand):
    help = (
        "Compare, per customer and hour, the usage delivered to Stripe with Stripe's meter "
        "event summaries; record and report the differences."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, help="Days back (default STRIPE_RECONCILE_DAYS).")
        parser.add_argument(
            "--customer", action="append", help="Only this Stripe customer id (repeatable)."
        )

    @job_recorded(STRIPE_RECONCILE.task)
    def handle(self, *args: Any, **options: Any) -> None:
        run = billing_reconcile(days=options["days"], customer_ids=options["customer"])
        if run.error:
            raise CommandError(f"Reconciliation failed: {run.error}")
        if run.is_clean:
            self.stdout.write(
                f"Clean: {run.hours_checked} customer-hour(s) of {run.customers} customer(s) "
                "match Stripe."
            )
            return
        self.stdout.write(f"{run.differences} difference(s) (see the admin, run {run.pk}):")
        for diff in run.diffs.all():
            self.stdout.write(
                f"  {diff.customer_id} {diff.hour:%Y-%m-%d %H}:00 UTC: delivered "
                f"{diff.delivered_units}, Stripe has {diff.stripe_units}"
            )
