"""The schema-per-tenant host (django-tenants): llm_budgets lives in the shared (public) schema,
and the host tenant a request's domain names is the llm_budgets tenant of the same id."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from llm_budgets.models import Membership, Tenant
from tests.conftest import client_for, make_user


@pytest.mark.django_db
def test_llm_budgets_tables_live_in_the_shared_schema_only(people) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT table_schema FROM information_schema.tables "
            "WHERE table_name LIKE 'llm_budgets%%'"
        )
        schemas = {row[0] for row in cursor.fetchall()}
        cursor.execute("SELECT schema_name FROM information_schema.schemata")
        all_schemas = {row[0] for row in cursor.fetchall()}
    assert "acme" in all_schemas  # the host tenant's own schema exists
    assert schemas == {"public"}


@pytest.mark.django_db
def test_a_domain_shows_only_its_own_tenant(people, llmb_setup) -> None:
    llmb_setup("globex", limit="10")
    outsider = make_user("outsider")
    Membership.objects.create(
        user=outsider, tenant=Tenant.objects.get(external_id="globex"), role="admin"
    )
    # A member of another tenant on acme's domain, and acme's own admin on the public domain.
    assert client_for(outsider).get("/usage/").status_code == 403
    public = Client()
    public.force_login(people["admin"])
    assert public.get("/usage/").status_code == 403
    assert client_for(people["admin"]).get("/usage/").status_code == 200
