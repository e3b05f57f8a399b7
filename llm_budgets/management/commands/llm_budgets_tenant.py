"""Create or update a tenant (``tenants.tenant_ensure``: validated, audited), or show one.

python manage.py llm_budgets_tenant create acme --name "Acme Corp" --timezone Europe/Amsterdam
python manage.py llm_budgets_tenant show acme
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.exceptions import BudgetError
from llm_budgets.tenancy.tenants import tenant_ensure, tenant_get


class Command(BaseCommand):
    help = "Create or update a tenant (create), or print one (show)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="Create the tenant, or update the given fields.")
        create.add_argument("external_id", help="The host's id for the tenant (e.g. its org slug).")
        create.add_argument("--name", help="Display name.")
        create.add_argument("--timezone", help="IANA zone of its calendar windows (default UTC).")
        create.add_argument("--billing-day", type=int, help="Day of month its periods start.")
        create.add_argument("--plan", help="Name of an existing plan.")
        create.add_argument("--billing-emails", help="Billing contacts, comma-separated.")
        show = actions.add_parser("show", help="Print the tenant's settings.")
        show.add_argument("external_id")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "show":
                tenant = tenant_get(options["external_id"])
            else:
                tenant = tenant_ensure(
                    options["external_id"],
                    name=options["name"],
                    timezone=options["timezone"],
                    billing_day=options["billing_day"],
                    plan=options["plan"],
                    billing_emails=options["billing_emails"],
                    actor="manage.py",
                )
        except BudgetError as exc:
            raise CommandError(str(exc)) from exc
        plan = tenant.plan.name if tenant.plan is not None else "-"
        self.stdout.write(
            f"tenant {tenant.external_id}: name {tenant.name!r}, timezone {tenant.timezone}, "
            f"billing day {tenant.billing_day}, plan {plan}"
        )
