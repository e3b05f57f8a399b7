from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from demo.demonstration import ADMIN_USERNAME, as_json, demo_data_load, render_data


class Command(BaseCommand):
    help = (
        "Load demo prices, a plan, tenants, budgets and reservations (idempotent), and give the "
        f"superuser {ADMIN_USERNAME!r} a new random password, printed at the end. For demo and "
        "development databases only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-admin", action="store_true", help=f"Leave the {ADMIN_USERNAME!r} user alone."
        )
        parser.add_argument(
            "--admin-password",
            help="Use this password instead of a random one (e.g. for a recorded tour).",
        )
        parser.add_argument("--json", action="store_true", help="Print the summary as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        data = demo_data_load(
            admin=not options["no_admin"], admin_password=options["admin_password"]
        )
        self.stdout.write(as_json(data) if options["json"] else render_data(data))
