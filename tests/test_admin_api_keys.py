"""API keys in the admin: created through the service and shown once, revoked with an action,
never edited or deleted."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from llm_budgets.models import ApiKey, AuditEvent, Tenant
from tests.api import BASE, client_for
from tests.factories import seed

pytestmark = pytest.mark.django_db

ADD = "admin:llm_budgets_apikey_add"
CHANGELIST = "admin:llm_budgets_apikey_changelist"


def _logged_in(**fields: object) -> Client:
    user = get_user_model().objects.create_user(password=None, **fields)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client() -> Client:
    return _logged_in(username="admin", is_staff=True, is_superuser=True)


def test_adding_a_key_shows_it_once_and_it_works(admin_client: Client) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    response = admin_client.post(
        reverse(ADD), {"name": "acme backend", "tenant": tenant.pk, "expiry_date": ""}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    [key] = re.findall(r"The API key is: (\S+)", page)
    api_key = ApiKey.objects.get()
    assert key.startswith(f"{api_key.prefix}.")
    assert api_key.tenant == tenant
    assert client_for(key).get(f"{BASE}tenants/acme/status").status_code == 200
    assert AuditEvent.objects.filter(action="api_key.create", actor="admin").exists()
    # Never again: neither the list nor the key's page shows the secret.
    secret = key.partition(".")[2]
    assert secret not in admin_client.get(reverse(CHANGELIST)).content.decode()
    change = reverse("admin:llm_budgets_apikey_change", args=[quote(api_key.pk)])
    detail = admin_client.get(change)
    assert detail.status_code == 200
    assert secret not in detail.content.decode()


def test_a_key_without_tenant_is_an_operator_key(admin_client: Client) -> None:
    admin_client.post(reverse(ADD), {"name": "ops", "tenant": "", "expiry_date": ""})
    assert ApiKey.objects.get().is_operator


def test_an_expiry_in_the_past_is_refused(admin_client: Client) -> None:
    past = timezone.now() - timedelta(days=1)
    response = admin_client.post(
        reverse(ADD),
        {
            "name": "old",
            "tenant": "",
            "expiry_date_0": past.strftime("%Y-%m-%d"),
            "expiry_date_1": past.strftime("%H:%M:%S"),
        },
    )
    assert response.status_code == 200
    assert "must be in the future" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_revoking_is_an_audited_action_needing_change_permission(admin_client: Client) -> None:
    admin_client.post(reverse(ADD), {"name": "ops", "tenant": "", "expiry_date": ""})
    api_key = ApiKey.objects.get()
    viewer = _logged_in(username="viewer", is_staff=True)
    viewer_user = get_user_model().objects.get(username="viewer")
    viewer_user.user_permissions.add(
        Permission.objects.get(codename="view_apikey", content_type__app_label="llm_budgets")
    )
    form = {"action": "revoke", "_selected_action": [api_key.pk]}
    viewer.post(reverse(CHANGELIST), form)
    assert not ApiKey.objects.get().revoked
    admin_client.post(reverse(CHANGELIST), form)
    assert ApiKey.objects.get().revoked
    assert AuditEvent.objects.filter(action="api_key.revoke", actor="admin").exists()


def test_keys_are_never_edited_or_deleted(admin_client: Client) -> None:
    admin_client.post(reverse(ADD), {"name": "ops", "tenant": "", "expiry_date": ""})
    api_key = ApiKey.objects.get()
    pk = quote(api_key.pk)
    assert (
        admin_client.get(reverse("admin:llm_budgets_apikey_delete", args=[pk])).status_code == 403
    )
    response = admin_client.post(
        reverse("admin:llm_budgets_apikey_change", args=[pk]), {"name": "renamed"}
    )
    assert response.status_code == 403
    assert ApiKey.objects.get().name == "ops"
