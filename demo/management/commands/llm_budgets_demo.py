from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.demonstration import as_json, demo_run, render


class Command(BaseCommand):
    help = (
        "Show, side by side, a naive check-then-call counter and llm_budgets under 10 concurrent "
        "calls and 4 failing calls (real threads, a fake 5 ms provider). Creates its own demo "
        "tenants on each run. Exits non-zero if llm_budgets admitted past a limit or leaked a hold."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print the counted results as JSON."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = demo_run()
        self.stdout.write(as_json(report) if options["json"] else render(report))
        if report.problems:
            raise CommandError(
                "llm_budgets broke a guarantee in the demo:\n" + "\n".join(report.problems)
            )
