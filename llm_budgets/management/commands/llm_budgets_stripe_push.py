from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from llm_budgets.billing.client import StripeNotConfigured
from llm_budgets.billing.stripe_push import stripe_push
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import STRIPE_PUSH


class Command(BaseCommand):
    help = (
        "Deliver pending Stripe usage now, in this process: build meter events of closed hours "
        "and send what is due. Safe to run twice or in several processes at once."
    )

    @job_recorded(STRIPE_PUSH.task)
    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = stripe_push()
        except StripeNotConfigured as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Stripe push: {result}.")
