"""The host's shared test pieces: users of its own user model, a tenant with its admin, member
and support person (llm_budgets' kit does prices, tenants and budgets)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from shop.tenancy import create_host_tenant

from llm_budgets.models import Membership, Tenant
from llm_budgets.roles import SUPPORT

CASE = settings.HOST_CASE
HOST = {"HTTP_HOST": "acme.localhost"} if CASE == "django_tenants" else {}


def make_user(label: str, **extra: object):
    """A user of the host's own user model, whatever it identifies people by (no password:
    the tests log in with ``force_login``, and hashing one costs a second)."""
    User = get_user_model()
    ident = f"{label}@example.com" if User.USERNAME_FIELD == "email" else label
    if User.USERNAME_FIELD != "email" and any(f.name == "email" for f in User._meta.fields):
        extra.setdefault("email", f"{label}@example.com")
    if extra.pop("superuser", False):
        return User.objects.create_superuser(**{User.USERNAME_FIELD: ident}, password=None, **extra)
    return User.objects.create_user(**{User.USERNAME_FIELD: ident}, password=None, **extra)


def client_for(user) -> Client:
    client = Client(**HOST)
    client.force_login(user)
    return client


@pytest.fixture(scope="session")
def host_tenants(django_db_setup, django_db_blocker) -> None:
    """A host with tenants of its own creates its tenant "acme" (django-tenants: a schema,
    migrated) once, committed, rather than in every test."""
    with django_db_blocker.unblock():
        create_host_tenant("acme", "Acme")


@pytest.fixture
def people(host_tenants, llmb_setup):
    """Tenant acme (priced, capped, each user capped), its admin and member, a support person."""
    llmb_setup("acme", name="Acme", limit="100", each_user_limit="5")
    tenant = Tenant.objects.get(external_id="acme")
    admin_user, member = make_user("boss"), make_user("alice")
    Membership.objects.create(user=admin_user, tenant=tenant, role="admin")
    Membership.objects.create(user=member, tenant=tenant, role="member")
    support = make_user("helpdesk", is_staff=True)
    support.groups.add(Group.objects.get(name=SUPPORT))
    return {"admin": admin_user, "member": member, "support": support}
