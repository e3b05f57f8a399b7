"""Delete stored Idempotency-Key responses older than N hours (run daily, like clearsessions)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.api.idempotency import idempotency_records_clear


class Command(BaseCommand):
    help = "Delete stored REST API idempotent responses older than --hours (default 24)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hours", type=int, default=24, help="Keep this many hours.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["hours"] < 1:
            raise CommandError("--hours must be at least 1.")
        deleted = idempotency_records_clear(older_than=timedelta(hours=options["hours"]))
        self.stdout.write(f"Deleted {deleted} idempotency record(s).")
