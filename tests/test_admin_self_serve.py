"""The operators' self-serve settings in the admin: the tenant's switch and ceiling override go
through ``tenant_self_serve_set`` (audited), an API key's ``self_serve`` through
``api_key_create``; the services' refusals show beside their fields, with nothing written."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from llm_budgets.models import ApiKey, AuditEvent, Plan, Tenant
from tests.factories import seed

pytestmark = pytest.mark.django_db

KEY_ADD = "admin:llm_budgets_apikey_add"


@pytest.fixture
def admin_client() -> Client:
    user = get_user_model().objects.create_user(
        username="admin", password=None, is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(user)
    return client


def _tenant_form(tenant: Tenant, **fields: str) -> dict[str, str]:
    return {
        "name": tenant.name,
        "plan": str(tenant.plan_id or ""),
        "timezone": tenant.timezone,
        "billing_day": str(tenant.billing_day),
        "_save": "1",
        **fields,
    }


def _change(tenant: Tenant) -> str:
    return reverse("admin:llm_budgets_tenant_change", args=[tenant.pk])


def test_the_override_and_ceiling_are_set_through_the_service(admin_client: Client) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    plan = Plan.objects.create(name="pro", self_serve=False, self_serve_ceiling=Decimal(20))
    Tenant.objects.filter(pk=tenant.pk).update(plan=plan)
    tenant.refresh_from_db()
    page = strip_tags(admin_client.get(_change(tenant)).content.decode())
    assert "Off (plan pro)" in page
    assert "20.00 USD per budget (plan pro)" in page

    response = admin_client.post(
        _change(tenant),
        _tenant_form(tenant, self_serve_switch="on", self_serve_ceiling_override="50"),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant.refresh_from_db()
    assert (tenant.self_serve, tenant.self_serve_ceiling) == (True, Decimal(50))
    event = AuditEvent.objects.get(action="tenant.self_serve", tenant=tenant)
    assert event.actor == "admin"
    assert event.before == {"self_serve": None, "ceiling": None}
    assert event.after == {"self_serve": True, "ceiling": "50"}
    page = strip_tags(admin_client.get(_change(tenant)).content.decode())
    assert "On (set on this tenant)" in page
    assert "50.00 USD per budget (set on this tenant)" in page

    # Saving again unchanged writes no second audit row; back to the plan's is one more.
    admin_client.post(
        _change(tenant),
        _tenant_form(tenant, self_serve_switch="on", self_serve_ceiling_override="50"),
    )
    assert AuditEvent.objects.filter(action="tenant.self_serve").count() == 1
    admin_client.post(_change(tenant), _tenant_form(tenant))
    tenant.refresh_from_db()
    assert (tenant.self_serve, tenant.self_serve_ceiling) == (None, None)
    assert AuditEvent.objects.filter(action="tenant.self_serve").count() == 2


@pytest.mark.parametrize("ceiling", ["-5", "+5", "1e3", "ten"])
def test_a_bad_ceiling_is_refused_by_field_with_nothing_written(
    admin_client: Client, ceiling: str
) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    before = AuditEvent.objects.count()
    response = admin_client.post(
        _change(tenant),
        _tenant_form(
            tenant, name="Renamed", self_serve_switch="on", self_serve_ceiling_override=ceiling
        ),
    )
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["self_serve_ceiling_override"]
    assert "ceiling" in form.errors["self_serve_ceiling_override"][0]
    tenant.refresh_from_db()
    assert tenant.name != "Renamed"
    assert (tenant.self_serve, tenant.self_serve_ceiling) == (None, None)
    assert AuditEvent.objects.count() == before


def test_the_tenant_list_shows_the_effective_switch(admin_client: Client) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    Tenant.objects.filter(pk=tenant.pk).update(self_serve=True)
    page = strip_tags(
        admin_client.get(reverse("admin:llm_budgets_tenant_changelist")).content.decode()
    )
    assert "On (tenant)" in page


def test_a_tenant_key_can_be_made_self_serve(admin_client: Client) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    response = admin_client.post(
        reverse(KEY_ADD),
        {"name": "acme admin", "tenant": tenant.pk, "expiry_date": "", "self_serve": "on"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    key = ApiKey.objects.get()
    assert key.self_serve
    event = AuditEvent.objects.get(action="api_key.create")
    assert (event.actor, event.after["self_serve"]) == ("admin", True)
    listing = admin_client.get(reverse("admin:llm_budgets_apikey_changelist"))
    assert listing.status_code == 200
    detail = admin_client.get(reverse("admin:llm_budgets_apikey_change", args=[key.pk]))
    assert "Self serve" in strip_tags(detail.content.decode()) or "self_serve" in (
        detail.content.decode()
    )


def test_self_serve_is_refused_for_an_operator_key(admin_client: Client) -> None:
    response = admin_client.post(
        reverse(KEY_ADD), {"name": "ops", "tenant": "", "expiry_date": "", "self_serve": "on"}
    )
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["self_serve"]
    assert "Only the operators grant self_serve" in form.errors["self_serve"][0]
    assert not ApiKey.objects.exists()
    assert not AuditEvent.objects.filter(action="api_key.create").exists()
