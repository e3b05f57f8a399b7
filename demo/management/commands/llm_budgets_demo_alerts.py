from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from demo.alerts_demo import alerts_demo_render, alerts_demo_run


class Command(BaseCommand):
    help = (
        "Cross a demo budget's warning threshold and show the signed webhook for it arriving "
        "at a receiver on 127.0.0.1, verified as docs/alerts.md tells a receiver to."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = alerts_demo_run()
        self.stdout.write(alerts_demo_render(report))
        if report.thresholds != [50, 80] or not report.verified:
            raise CommandError(
                "The 50% and 80% threshold alerts did not each arrive once, signed and verified."
            )
