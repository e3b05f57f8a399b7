from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from demo.prepaid_demo import prepaid_demo_render, prepaid_demo_run


class Command(BaseCommand):
    help = (
        "Top up a demo tenant's prepaid balance through a fake Stripe Checkout on 127.0.0.1 "
        "(webhooks delivered twice, credited once) and spend it down to a refusal."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = prepaid_demo_run()
        self.stdout.write(prepaid_demo_render(report))
        if report.credited != Decimal(100) or "Top up" not in report.refusal:
            raise CommandError("The top-up was not credited exactly once, or no refusal said so.")
