from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.jobs.records import job_recorded
from llm_budgets.jobs.rollups import (
    daily_usage_rebuild,
    daily_usage_rebuild_all,
    daily_usage_refresh,
)
from llm_budgets.schedule import ROLLUP_DAILY_USAGE


class Command(BaseCommand):
    help = (
        "Rebuild daily usage rollups from the ledger: the last ROLLUP_LOOKBACK_DAYS days, a date "
        "range (--since/--until), or everything (--all). Idempotent."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", type=date.fromisoformat, help="First day (YYYY-MM-DD).")
        parser.add_argument("--until", type=date.fromisoformat, help="Last day (YYYY-MM-DD).")
        parser.add_argument("--all", action="store_true", help="Every day of the ledger.")

    @job_recorded(ROLLUP_DAILY_USAGE.task)
    def handle(self, *args: Any, **options: Any) -> None:
        since, until = options["since"], options["until"]
        if options["all"]:
            written = daily_usage_rebuild_all()
        elif since or until:
            if not (since and until) or since > until:
                raise CommandError("Give both --since and --until, with since <= until.")
            written = daily_usage_rebuild(since=since, until=until)
        else:
            written = daily_usage_refresh()
        self.stdout.write(f"Wrote {written} daily usage row(s).")
