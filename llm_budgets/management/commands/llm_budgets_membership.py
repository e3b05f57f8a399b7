"""Give a host user access to a tenant's usage pages (a Membership), change it, or remove it.

python manage.py llm_budgets_membership add ada@example.com acme --role admin
python manage.py llm_budgets_membership add bob acme --role member --end-user u-17
python manage.py llm_budgets_membership remove bob acme

The user is named by the user model's USERNAME_FIELD (the email on email-login hosts).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from llm_budgets.exceptions import BudgetError
from llm_budgets.models import Membership, MembershipRole
from llm_budgets.tenancy.tenants import tenant_get
from llm_budgets.validation import identifier


class Command(BaseCommand):
    help = "Add (or change) or remove a host user's membership of a tenant (the usage pages)."

    def add_arguments(self, parser: CommandParser) -> None:
        login = get_user_model().USERNAME_FIELD
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="Add the membership, or change its role/end user.")
        add.add_argument("user", help=f"The user's {login}.")
        add.add_argument("tenant", help="The tenant's external id.")
        add.add_argument(
            "--role", choices=MembershipRole.values, default=MembershipRole.MEMBER.value
        )
        add.add_argument(
            "--end-user",
            default="",
            help="A member's end user id (default: LLM_BUDGETS['END_USER_ID'] of the user).",
        )
        remove = actions.add_parser("remove", help="Remove the membership.")
        remove.add_argument("user", help=f"The user's {login}.")
        remove.add_argument("tenant", help="The tenant's external id.")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        login = user_model.USERNAME_FIELD
        try:
            user = user_model._default_manager.get(**{login: options["user"]})
        except user_model.DoesNotExist:
            raise CommandError(f"No user has {login} {options['user']!r}.") from None
        try:
            tenant = tenant_get(options["tenant"])
            end_user = options.get("end_user") or ""
            if end_user:
                end_user = identifier("end_user", end_user)
        except BudgetError as exc:
            raise CommandError(str(exc)) from exc
        if options["action"] == "remove":
            deleted, _ = Membership.objects.filter(user=user, tenant=tenant).delete()
            self.stdout.write(f"Removed {deleted} membership(s).")
            return
        membership, created = Membership.objects.update_or_create(
            user=user,
            tenant=tenant,
            defaults={"role": options["role"], "end_user_external_id": end_user},
        )
        self.stdout.write(
            f"{'Added' if created else 'Updated'} {options['user']} in {tenant.external_id} as "
            f"{membership.role}; sees end user "
            f"{membership.end_user_key if membership.role == MembershipRole.MEMBER else 'all'}."
        )
