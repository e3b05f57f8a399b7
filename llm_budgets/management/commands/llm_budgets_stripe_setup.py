from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.billing.client import StripeNotConfigured
from llm_budgets.billing.setup import billing_setup, event_names


class Command(BaseCommand):
    help = (
        "Create (or find) the Stripe meter (sum, customer by id) and its monthly metered price "
        "for each meter event name in use, and print their ids. Safe to run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--event-name", help="Only this event name (default: all in use).")
        parser.add_argument("--currency", help="Price currency (default: LLM_BUDGETS CURRENCY).")

    def handle(self, *args: Any, **options: Any) -> None:
        names = [options["event_name"]] if options["event_name"] else event_names()
        for name in names:
            try:
                result = billing_setup(event_name=name, currency=options["currency"])
            except StripeNotConfigured as exc:
                raise CommandError(str(exc)) from None
            meter = "created" if result.created_meter else "found"
            price = "created" if result.created_price else "found"
            self.stdout.write(
                f"event name {result.event_name}: meter {result.meter_id} ({meter}), "
                f"metered price {result.price_id} ({price})"
            )
        self.stdout.write(
            "Subscribe each customer to the metered price, then link its tenant: "
            "budgets.link_stripe_customer(tenant=..., customer_id='cus_...')."
        )
