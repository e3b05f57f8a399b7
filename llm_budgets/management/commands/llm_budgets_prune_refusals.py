from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from llm_budgets.control.refusals import refusals_prune


class Command(BaseCommand):
    help = "Delete refusal records older than --days (default 90). The ledger is never touched."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, default=90)

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"]
        if days < 1:
            self.stderr.write("--days must be at least 1.")
            return
        deleted = refusals_prune(before=timezone.now() - timedelta(days=days))
        self.stdout.write(f"Deleted {deleted} refusal record(s) older than {days} day(s).")
