"""Fixtures for the tenant pages' tests: two tenants with usage, and the people who look."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import Group, User
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.jobs.rollups import daily_usage_rebuild
from llm_budgets.models import Membership, MembershipRole, Tenant
from llm_budgets.roles import SUPPORT
from tests.factories import reserve_30, seed

PAGES = ["/usage/", "/usage/models/", "/usage/users/", "/usage/refusals/", "/usage/export.csv"]
# Names only acme's data carries: none of them may ever appear in beta's pages or export.
ACME_MARKERS = [
    "alice-acme",
    "bob-acme",
    "<script>acme</script>",
    "=HYPERLINK(acme)",
    "acme-secret",  # a tag budget and a run budget
]
BETA_MARKERS = ["zed-beta", "beta-secret"]


@dataclass
class People:
    acme_admin: User
    acme_member: User  # sees only the end user "alice-acme"
    beta_admin: User
    support: User  # staff in the support group
    staff_only: User  # staff without the support permission
    stranger: User  # logged in, no membership


def use(tenant: str, end_user: str, output_tokens: int) -> None:
    """One committed call: 0.03 per output token (the fixture price)."""
    hold = reserve_30(tenant=tenant, end_user=end_user)
    hold.commit(input_tokens=0, output_tokens=output_tokens)


def rebuild_rollups() -> None:
    today = timezone.now().date()
    daily_usage_rebuild(since=today - timedelta(days=2), until=today + timedelta(days=1))


def usage_data() -> None:
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Amsterdam")
    seed(tenant="acme", limit="1000")
    seed(tenant="beta", limit="1000")
    budgets.ensure_tenant(tenant="acme", name="Acme <b>Corp</b>")
    budgets.set_limit(tenant="acme", end_user="alice-acme", amount=Decimal(100), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(50), window="day")
    use("acme", "alice-acme", 500)  # 15.00
    use("acme", "alice-acme", 100)  # 3.00
    use("acme", "bob-acme", 200)  # 6.00
    use("acme", "<script>acme</script>", 10)
    use("acme", "=HYPERLINK(acme)", 10)
    use("beta", "zed-beta", 300)  # 9.00
    # Budgets on a tag and a run: the organisation's (issue #16), with names only each has.
    budgets.set_limit(tenant="acme", tag=("project", "acme-secret"), amount=80, window="month")
    budgets.set_limit(tenant="acme", run="run-acme-secret", amount=5, window="lifetime")
    budgets.set_limit(tenant="beta", tag=("project", "beta-secret"), amount=80, window="month")
    reserve_30(tenant="acme", end_user="bob-acme")  # an open hold: reserved 30
    rebuild_rollups()


def _user(username: str, **extra: object) -> User:
    return User.objects.create_user(username, password="pw", **extra)  # type: ignore[arg-type]


def people() -> People:
    acme, beta = Tenant.objects.get(external_id="acme"), Tenant.objects.get(external_id="beta")
    result = People(
        acme_admin=_user("ann"),
        acme_member=_user("alice"),
        beta_admin=_user("bea"),
        support=_user("sue", is_staff=True),
        staff_only=_user("stan", is_staff=True),
        stranger=_user("sam"),
    )
    Membership.objects.create(user=result.acme_admin, tenant=acme, role=MembershipRole.ADMIN)
    Membership.objects.create(
        user=result.acme_member,
        tenant=acme,
        role=MembershipRole.MEMBER,
        end_user_external_id="alice-acme",
    )
    Membership.objects.create(user=result.beta_admin, tenant=beta, role=MembershipRole.ADMIN)
    result.support.groups.add(Group.objects.get(name=SUPPORT))
    return result
