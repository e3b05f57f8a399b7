from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from demo.stripe_demo import stripe_demo_render, stripe_demo_run


class Command(BaseCommand):
    help = (
        "Deliver a demo tenant's usage to a fake Stripe server on 127.0.0.1 (with a lost "
        "answer on the way) and show that Stripe holds it exactly once; then print what to "
        "configure for a real test-mode account."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = stripe_demo_run()
        self.stdout.write(stripe_demo_render(report))
        if abs(report.stripe_units - report.ledger_total * 1_000_000) > 1:
            raise CommandError("Stripe's total differs from the ledger's by more than one unit.")
