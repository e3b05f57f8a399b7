"""Create a REST API key for one tenant or for the operator; prints the key alone on its last line.

python manage.py llm_budgets_create_api_key --tenant acme --name "acme backend"
python manage.py llm_budgets_create_api_key --operator --name ops
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from llm_budgets.control.api_keys import api_key_create
from llm_budgets.exceptions import BudgetError


class Command(BaseCommand):
    help = "Create a REST API key (tenant-scoped or operator-wide); the key is shown only once."

    def add_arguments(self, parser: CommandParser) -> None:
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--tenant", metavar="EXTERNAL_ID", help="Key acts only for this tenant.")
        scope.add_argument(
            "--operator", action="store_true", help="Key acts for every tenant, may set limits."
        )
        parser.add_argument("--name", default="", help="A label for the key (default: its scope).")
        parser.add_argument(
            "--expires-in-days", type=int, default=None, help="Expire the key after N days."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = options["tenant"]
        name = options["name"] or ("operator" if tenant is None else f"tenant {tenant}")[:50]
        days = options["expires_in_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-in-days must be at least 1.")
        expires_at = None if days is None else timezone.now() + timedelta(days=days)
        try:
            api_key, key = api_key_create(
                tenant=tenant, name=name, expires_at=expires_at, actor="manage.py"
            )
        except BudgetError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(
            f"Created {api_key.scope_label} API key {api_key.prefix!r} ({api_key.name}). "
            "Store it now: it is not shown again. Send it as 'Authorization: Api-Key <key>'."
        )
        self.stdout.write(key)
