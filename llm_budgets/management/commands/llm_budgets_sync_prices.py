from __future__ import annotations

import importlib.util
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.pricing.sync import SyncReport, prices_sync


class ProgressBar:
    """A one-line bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, stream: Any, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.enabled = hasattr(stream, "isatty") and stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or not total:
            return
        filled = self.width * done // total
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} models")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


class Command(BaseCommand):
    help = (
        "Import price versions from genai-prices' bundled catalogue (no network): current, "
        "historical and announced future prices. Idempotent; never overrides a manual price."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--provider", help="Only this provider id (e.g. openai).")
        parser.add_argument("--model", help="Only this model id (e.g. gpt-4o).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Print the changes without writing them."
        )
        parser.add_argument(
            "--verbose-unchanged", action="store_true", help="Also list unchanged versions."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if importlib.util.find_spec("genai_prices") is None:
            raise CommandError(
                "genai-prices is not installed: install the [prices] extra "
                "(pip install 'llm-budgets[prices]'), or add prices in the admin or with "
                "budgets.set_price() instead."
            )
        report = prices_sync(
            provider=options["provider"],
            model=options["model"],
            dry_run=options["dry_run"],
            progress=ProgressBar(sys.stderr),
        )
        self._print(report, show_unchanged=options["verbose_unchanged"])

    def _print(self, report: SyncReport, *, show_unchanged: bool) -> None:
        prefix = "would be " if report.dry_run else ""
        for change in report.changes:
            if change.action in ("added", "changed") or (
                change.action == "unchanged" and show_unchanged
            ):
                self.stdout.write(f"{prefix}{change}")
        reasons = report.skipped_reasons()
        self.stdout.write(
            f"{report.source}{' (dry run, nothing written)' if report.dry_run else ''}: "
            f"{prefix}added {report.count('added')}, {prefix}changed {report.count('changed')}, "
            f"unchanged {report.count('unchanged')}, skipped {report.count('skipped')}."
        )
        for reason, count in reasons.most_common():
            self.stdout.write(f"  skipped {count}: {reason}")
        if report.ignored_dimensions:
            ignored = ", ".join(sorted(report.ignored_dimensions))
            self.stdout.write(
                f"  price keys not modelled (audio, image, video usage is not priced): {ignored}"
            )
        if not report.changed_anything:
            self.stdout.write("Nothing to change: prices are up to date.")
