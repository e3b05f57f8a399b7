"""Alerts from Stripe (issue 28, item 1): a failed payment (ignored or tripping the tenant's
switch, whose alert says so) and a parked usage delivery (the operators' only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.test import Client

from llm_budgets import budgets
from llm_budgets.alerts.bodies import SCHEMAS
from llm_budgets.alerts.endpoints import endpoint_create
from llm_budgets.billing.stripe_push import stripe_push
from llm_budgets.models import AlertDelivery, AlertEvent, Tenant
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.factories import reserve_30, seed
from tests.stripe_support import event, fake_stripe, set_up, sign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("application_clock")]
__all__ = ["fake_stripe"]

ALL = [schema.type for schema in SCHEMAS]
# What a tenant's endpoint may subscribe to (operators-only types are refused for it).
TENANTS = [schema.type for schema in SCHEMAS if schema.tenant_visible]
URL = "/api/llm-budgets/v1/stripe/webhook"


def subscribe(tenant: str | None) -> Any:
    owner = Tenant.objects.get(external_id=tenant) if tenant else None
    endpoint, _ = endpoint_create(
        tenant=owner,
        kind="webhook",
        target="https://hooks.example.com/x",
        event_types=TENANTS if owner else ALL,
    )
    return endpoint


def fail_payment(cid: str, invoice: str, stripe_event: str) -> None:
    payload = event("invoice.payment_failed", {"id": invoice, "customer": cid}, stripe_event)
    response = Client().post(
        URL, payload, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(payload)
    )
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("action", ["ignore", "trip"])
def test_a_failed_payment_alerts_the_tenant_once_per_stripe_event(
    fake_stripe: StripeServer, settings: Any, action: str
) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "STRIPE_ON_PAYMENT_FAILED": action}
    cid = set_up(fake_stripe)
    mine = subscribe("acme")
    fail_payment(cid, "in_42", "evt_fail")
    fail_payment(cid, "in_42", "evt_fail")  # Stripe retries the webhook: processed once
    (failed,) = AlertEvent.objects.filter(type="payment.failed")
    assert failed.body["invoice_id"] == "in_42"
    assert failed.body["stripe_event_id"] == "evt_fail"
    assert failed.body["action"] == action
    assert AlertDelivery.objects.filter(event=failed, endpoint=mine).exists()
    tripped = AlertEvent.objects.filter(type="kill_switch.tripped")
    if action == "trip":
        (switch,) = tripped
        assert switch.body["cause"] == "payment_failed"
    else:
        assert not tripped.exists()


def test_a_parked_delivery_alerts_the_operators_only(fake_stripe: StripeServer) -> None:
    start = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    with time_machine.travel(start + timedelta(minutes=1), tick=False):
        seed(limit="100000")
        from llm_budgets.billing.setup import billing_setup

        billing_setup(event_name="llm_usage")
        budgets.link_stripe_customer(tenant="acme", customer_id="cus_missing")
        tenant_hook = subscribe("acme")
        operators = subscribe(None)
        reserve_30().commit(input_tokens=0, output_tokens=1000)
    with time_machine.travel(start + timedelta(hours=1, minutes=1), tick=False):
        assert stripe_push().parked == 1
    (parked,) = AlertEvent.objects.filter(type="stripe.delivery_parked")
    assert parked.tenant is None
    assert parked.body["customer_id"] == "cus_missing"
    assert "No such customer" in parked.body["error"]
    assert list(AlertDelivery.objects.filter(event=parked).values_list("endpoint", flat=True)) == [
        operators.pk
    ]
    assert not AlertDelivery.objects.filter(event=parked, endpoint=tenant_hook).exists()
