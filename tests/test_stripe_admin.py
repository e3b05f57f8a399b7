"""Stripe billing in the admin (issue 11, item 7) and its settings checks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from llm_budgets.billing.checks import check_linked_without_key
from llm_budgets.billing.reconciliation import billing_reconcile
from llm_budgets.billing.stripe_push import stripe_push
from llm_budgets.checks import check_settings
from llm_budgets.models import (
    AuditEvent,
    MeterDelivery,
    MeterDeliveryState,
    StripeCustomerLink,
    Tenant,
)
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.factories import reserve_30, seed
from tests.stripe_support import fake_stripe, set_up

pytestmark = pytest.mark.django_db
__all__ = ["fake_stripe"]


def logged_in(*permissions: str, superuser: bool = False) -> Client:
    user = get_user_model().objects.create_user(
        username="carol", password=None, is_staff=True, is_superuser=superuser
    )
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def parked_delivery(fake: StripeServer) -> MeterDelivery:
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    with time_machine.travel(hour + timedelta(minutes=1), tick=False):
        cid = set_up(fake)
        reserve_30().commit(input_tokens=0, output_tokens=1000)
    del fake.state.customers[cid]  # Stripe no longer knows the customer
    stripe_push()
    return MeterDelivery.objects.get()


def test_the_tenant_page_shows_the_link_what_waits_what_is_parked_and_the_last_run(
    fake_stripe: StripeServer,
) -> None:
    parked = parked_delivery(fake_stripe)
    assert parked.state == MeterDeliveryState.PARKED
    billing_reconcile()
    reserve_30().commit(input_tokens=0, output_tokens=10)  # this hour: waits in the outbox
    client = logged_in(superuser=True)
    tenant = Tenant.objects.get()
    page = client.get(reverse("admin:llm_budgets_tenant_change", args=[tenant.pk])).content
    text = page.decode()
    assert "Stripe billing" in text
    assert StripeCustomerLink.objects.get().customer_id in text
    assert "Waiting in the outbox: 1 ledger line(s)" in text
    assert "Parked" in text
    assert "Last reconciliation" in text
    assert "never run" not in text
    delivery_page = client.get(
        reverse("admin:llm_budgets_meterdelivery_change", args=[parked.pk])
    ).content.decode()
    assert "No such customer" in delivery_page
    assert parked.request_id in delivery_page


def test_a_tenant_never_linked_shows_no_reconciliation(fake_stripe: StripeServer) -> None:
    parked_delivery(fake_stripe)
    billing_reconcile()  # a run exists, but it compared other tenants' customers
    seed(tenant="other")
    other = Tenant.objects.get(external_id="other")
    page = logged_in(superuser=True).get(
        reverse("admin:llm_budgets_tenant_change", args=[other.pk])
    )
    text = page.content.decode()
    assert "Not linked to a Stripe customer" in text
    assert "Last reconciliation" not in text


def test_staff_retry_parked_deliveries_with_the_permission(fake_stripe: StripeServer) -> None:
    parked = parked_delivery(fake_stripe)
    url = reverse("admin:llm_budgets_meterdelivery_changelist")
    data = {"action": "retry", "_selected_action": [parked.pk]}
    viewer = logged_in("view_meterdelivery")
    assert viewer.post(url, data).status_code == 200
    parked.refresh_from_db()
    assert parked.state == MeterDeliveryState.PARKED  # no permission: no action
    fake_stripe.add_customer(parked.customer_id)
    get_user_model().objects.all().delete()
    retrier = logged_in("view_meterdelivery", "retry_meterdelivery")
    assert retrier.post(url, data).status_code == 302
    parked.refresh_from_db()
    assert parked.state == MeterDeliveryState.PENDING
    assert "retried by carol" in parked.note
    assert stripe_push().sent == 1


def test_link_and_unlink_in_the_admin_are_audited(fake_stripe: StripeServer) -> None:
    seed()
    client = logged_in(superuser=True)
    tenant = Tenant.objects.get()
    add = reverse("admin:llm_budgets_stripecustomerlink_add")
    refused = client.post(add, {"tenant": tenant.pk, "customer_id": "acme"})
    assert "starts with cus_" in refused.content.decode()
    assert client.post(add, {"tenant": tenant.pk, "customer_id": "cus_A1"}).status_code == 302
    assert AuditEvent.objects.get(action="stripe.link").actor == "carol"
    changelist = reverse("admin:llm_budgets_stripecustomerlink_changelist")
    client.post(changelist, {"action": "unlink", "_selected_action": [tenant.pk]})
    assert not StripeCustomerLink.objects.get().active
    assert AuditEvent.objects.get(action="stripe.unlink").actor == "carol"


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        ("STRIPE_API_KEY", "pk_live_123", "llm_budgets.E070"),
        ("STRIPE_API_BASE", "api.stripe.com", "llm_budgets.E071"),
        ("STRIPE_METER_EVENT_NAME", "", "llm_budgets.E072"),
        ("STRIPE_METER_EVENT_NAME", "x" * 101, "llm_budgets.E072"),
        ("STRIPE_WEBHOOK_SECRET", "secret", "llm_budgets.E073"),
        ("STRIPE_ON_PAYMENT_FAILED", "suspend", "llm_budgets.E074"),
        ("STRIPE_MAX_ATTEMPTS", 0, "llm_budgets.E075"),
        ("STRIPE_RETRY_BASE_SECONDS", "30", "llm_budgets.E076"),
        ("STRIPE_RECONCILE_DAYS", -1, "llm_budgets.E077"),
    ],
)
def test_each_stripe_setting_is_checked(setting: str, value: Any, error: str) -> None:
    with override_settings(LLM_BUDGETS={setting: value}):
        assert [m.id for m in check_settings()] == [error]


def test_valid_stripe_settings_pass() -> None:
    good = {
        "STRIPE_API_KEY": "sk_test_abc",
        "STRIPE_API_BASE": "http://127.0.0.1:12111",
        "STRIPE_WEBHOOK_SECRET": "whsec_abc",
        "STRIPE_ON_PAYMENT_FAILED": "trip",
    }
    with override_settings(LLM_BUDGETS=good):
        assert check_settings() == []


def test_linked_customers_without_an_api_key_warn() -> None:
    seed()
    with override_settings(LLM_BUDGETS={}):
        assert check_linked_without_key(databases=["default"]) == []
        StripeCustomerLink.objects.create(
            tenant=Tenant.objects.get(), customer_id="cus_1", linked_at=timezone.now()
        )
        [warning] = check_linked_without_key(databases=["default"])
        assert warning.id == "llm_budgets.W070"
    with override_settings(LLM_BUDGETS={"STRIPE_API_KEY": "sk_test_1"}):
        assert check_linked_without_key(databases=["default"]) == []


def test_relink_in_the_admin_by_changing_the_customer(fake_stripe: StripeServer) -> None:
    seed()
    client = logged_in(superuser=True)
    tenant = Tenant.objects.get()
    add = reverse("admin:llm_budgets_stripecustomerlink_add")
    client.post(add, {"tenant": tenant.pk, "customer_id": "cus_A1"})
    change = reverse("admin:llm_budgets_stripecustomerlink_change", args=[tenant.pk])
    assert client.post(change, {"customer_id": "cus_B2"}).status_code == 302
    assert StripeCustomerLink.objects.get().customer_id == "cus_B2"
    relink = AuditEvent.objects.filter(action="stripe.link").order_by("pk").last()
    assert relink is not None
    assert relink.before == {"customer_id": "cus_A1", "active": True}
