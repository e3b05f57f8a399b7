"""Stripe webhooks (issue 11, item 6): signature first, stored raw, processed once, errors
stored and answered 5xx; payment failed / paid round trip; customer deleted; meter errors."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from llm_budgets import budgets
from llm_budgets.billing import webhooks
from llm_budgets.models import (
    AuditEvent,
    KillSwitch,
    MeterDelivery,
    MeterErrorReport,
    StripeCustomerLink,
    StripeWebhookEvent,
)
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.stripe_support import event, fake_stripe, set_up, sign

pytestmark = pytest.mark.django_db
__all__ = ["fake_stripe"]

URL = "/api/llm-budgets/v1/stripe/webhook"


def post(payload: bytes, signature: str | None) -> Any:
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature is not None else {}
    return Client().post(URL, payload, content_type="application/json", **headers)


def trip_on_failure(settings: Any) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "STRIPE_ON_PAYMENT_FAILED": "trip"}


@pytest.mark.parametrize(
    "signature",
    [None, "t=1,v1=deadbeef", sign(b"{}"), "garbage", sign(b"x", secret="whsec_other")],
)
def test_unsigned_or_wrongly_signed_requests_store_nothing(
    fake_stripe: StripeServer, signature: str | None
) -> None:
    payload = event("invoice.paid", {"id": "in_1", "customer": "cus_x"})
    response = post(payload, signature)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_signature"
    assert StripeWebhookEvent.objects.count() == 0


def test_a_stale_signature_is_refused(fake_stripe: StripeServer) -> None:
    payload = event("invoice.paid", {"id": "in_1", "customer": "cus_x"})
    assert post(payload, sign(payload, at=int(time.time()) - 3600)).status_code == 400
    assert StripeWebhookEvent.objects.count() == 0


def test_payment_failed_trips_the_tenant_and_paid_clears_only_that_switch(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    failed = event("invoice.payment_failed", {"id": "in_42", "customer": cid}, "evt_fail")
    response = post(failed, sign(failed))
    assert response.status_code == 200, response.content
    switch = KillSwitch.objects.get(cleared_at__isnull=True)
    assert "in_42" in switch.reason
    assert switch.tenant is not None
    # Stripe retries the delivery: processed once.
    assert post(failed, sign(failed)).status_code == 200
    row = StripeWebhookEvent.objects.get()
    assert row.attempts == 1
    assert row.processed_at is not None
    assert json.loads(row.payload)
    # A staff switch on another tenant is not ours to clear.
    set_up(fake_stripe, tenant="other")
    budgets.trip(tenant="other", reason="staff", actor="carol")
    paid = event("invoice.paid", {"id": "in_42", "customer": cid}, "evt_paid")
    assert post(paid, sign(paid)).status_code == 200
    switch.refresh_from_db()
    assert switch.cleared_at is not None
    assert switch.cleared_by == webhooks.ACTOR
    assert KillSwitch.objects.filter(cleared_at__isnull=True).count() == 1  # the staff one


def test_paid_never_clears_a_switch_a_person_tripped(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    budgets.trip(tenant="acme", reason="fraud review", actor="carol")
    failed = event("invoice.payment_failed", {"id": "in_1", "customer": cid}, "evt_a")
    post(failed, sign(failed))
    paid = event("invoice.paid", {"id": "in_1", "customer": cid}, "evt_b")
    post(paid, sign(paid))
    assert KillSwitch.objects.get().cleared_at is None


def test_payment_failed_is_ignored_by_default(fake_stripe: StripeServer) -> None:
    cid = set_up(fake_stripe)
    failed = event("invoice.payment_failed", {"id": "in_1", "customer": cid})
    assert post(failed, sign(failed)).status_code == 200
    assert KillSwitch.objects.count() == 0
    assert "ignore" in StripeWebhookEvent.objects.get().outcome


def test_customer_deleted_unlinks_with_an_audit_event(fake_stripe: StripeServer) -> None:
    cid = set_up(fake_stripe)
    deleted = event("customer.deleted", {"id": cid, "object": "customer"})
    assert post(deleted, sign(deleted)).status_code == 200
    assert not StripeCustomerLink.objects.get().active
    audit = AuditEvent.objects.get(action="stripe.unlink")
    assert audit.actor == webhooks.ACTOR
    assert "deleted" in audit.reason


def test_a_processing_error_is_stored_answered_500_and_retried(
    fake_stripe: StripeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = set_up(fake_stripe)
    deleted = event("customer.deleted", {"id": cid})

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("database hiccup")

    monkeypatch.setitem(webhooks.HANDLERS, "customer.deleted", broken)
    response = post(deleted, sign(deleted))
    assert response.status_code == 500
    row = StripeWebhookEvent.objects.get()
    assert row.processed_at is None
    assert "database hiccup" in row.error
    assert StripeCustomerLink.objects.get().active  # the transaction rolled back
    monkeypatch.undo()
    assert post(deleted, sign(deleted)).status_code == 200
    row.refresh_from_db()
    assert row.processed_at is not None
    assert row.error == ""
    assert row.attempts == 2


def test_meter_error_reports_are_recorded_against_the_deliveries_they_name(
    fake_stripe: StripeServer,
) -> None:
    set_up(fake_stripe)
    tenant = StripeCustomerLink.objects.get().tenant
    from django.utils import timezone

    now = timezone.now()
    delivery = MeterDelivery.objects.create(
        tenant=tenant,
        customer_id="cus_x",
        event_name="llm_usage",
        hour=now,
        timestamp=now,
        identifier="llmb-h-abc",
        amount=1,
        units=1_000_000,
        currency="USD",
        next_attempt_at=now,
        created_at=now,
    )
    thin = json.dumps(
        {
            "id": "evt_thin",
            "object": "v2.core.event",
            "type": "v1.billing.meter.error_report_triggered",
            "data": {
                "reason": {
                    "error_types": [
                        {
                            "code": "meter_event_customer_not_found",
                            "sample_errors": [
                                {
                                    "error_message": "No such customer",
                                    "request": {"identifier": "llmb-h-abc"},
                                }
                            ],
                        }
                    ]
                }
            },
        }
    ).encode()
    assert post(thin, sign(thin)).status_code == 200
    report = MeterErrorReport.objects.get()
    assert report.delivery == delivery
    assert report.code == "meter_event_customer_not_found"


def test_a_thin_meter_error_event_without_data_is_fetched_from_stripe(
    fake_stripe: StripeServer,
) -> None:
    set_up(fake_stripe)
    fake_stripe.state.v2_events["evt_thin2"] = {
        "id": "evt_thin2",
        "object": "v2.core.event",
        "type": "v1.billing.meter.no_meter_found",
        "created": "2026-11-20T10:00:00.000Z",
        "data": {
            "reason": {
                "error_types": [
                    {
                        "code": "no_meter",
                        "sample_errors": [
                            {"error_message": "no meter", "request": {"identifier": "llmb-h-x"}}
                        ],
                    }
                ]
            }
        },
    }
    thin = json.dumps(
        {"id": "evt_thin2", "object": "v2.core.event", "type": "v1.billing.meter.no_meter_found"}
    ).encode()
    assert post(thin, sign(thin)).status_code == 200
    report = MeterErrorReport.objects.get()
    assert report.identifier == "llmb-h-x"
    assert report.code == "no_meter"
    assert report.delivery is None  # names no delivery of ours: kept for staff all the same


# The payment switch follows the right invoices; odd signed payloads are 400s (issue 22 item 4).


def deliver(kind: str, invoice: str, customer: str, event_id: str) -> Any:
    payload = event(kind, {"id": invoice, "object": "invoice", "customer": customer}, event_id)
    response = post(payload, sign(payload))
    assert response.status_code == 200, response.content
    return response.json()["outcome"]


def stopped() -> bool:
    return KillSwitch.objects.filter(cleared_at__isnull=True).exists()


def test_a_paid_invoice_clears_the_switch_only_when_no_failed_invoice_is_left(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    deliver("invoice.payment_failed", "in_old", cid, "evt_1")
    deliver("invoice.payment_failed", "in_new", cid, "evt_2")
    assert KillSwitch.objects.count() == 1
    # Stripe delivers in no order: the old invoice's "paid" arrives while the new one is unpaid.
    assert "still waits on in_new" in deliver("invoice.paid", "in_old", cid, "evt_3")
    assert stopped()
    # An unrelated invoice paid changes nothing either.
    deliver("invoice.paid", "in_other", cid, "evt_4")
    assert stopped()
    assert deliver("invoice.paid", "in_new", cid, "evt_5").startswith("cleared kill switch")
    assert not stopped()


def test_a_failure_delivered_after_its_invoice_was_paid_trips_nothing(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    deliver("invoice.paid", "in_1", cid, "evt_paid")
    assert "late failure" in deliver("invoice.payment_failed", "in_1", cid, "evt_failed")
    assert KillSwitch.objects.count() == 0


def test_voided_settles_an_invoice_and_marked_uncollectible_does_not(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    deliver("invoice.payment_failed", "in_a", cid, "evt_1")
    assert deliver("invoice.voided", "in_a", cid, "evt_2").startswith("cleared")  # nothing owed
    assert not stopped()
    deliver("invoice.payment_failed", "in_b", cid, "evt_3")
    deliver("invoice.marked_uncollectible", "in_b", cid, "evt_4")  # written off, not paid
    assert stopped()
    deliver("invoice.paid", "in_b", cid, "evt_5")  # an uncollectible invoice paid after all
    assert not stopped()


def test_after_a_person_cleared_the_switch_a_new_failure_trips_it_again(
    fake_stripe: StripeServer, settings: Any
) -> None:
    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    deliver("invoice.payment_failed", "in_a", cid, "evt_1")
    budgets.clear(tenant="acme", reason="customer promised to pay", actor="carol")
    assert deliver("invoice.payment_failed", "in_b", cid, "evt_2").startswith("tripped")
    # in_a was forgiven when carol cleared the switch: paying in_b is enough.
    deliver("invoice.paid", "in_b", cid, "evt_3")
    assert not stopped()


def _deep(levels: int) -> bytes:
    head = b'{"id": "evt_deep", "type": "invoice.paid", "data": {"object": '
    return head + b"[" * levels + b"]" * levels + b"}}"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (_deep(5000), "payload"),
        (event("invoice.paid", {"id": ["in_1"], "customer": "cus_x"}), "data.object.id"),
        (event("invoice.paid", {"id": "in_1", "customer": ["cus_x"]}), "data.object.customer"),
        (event("invoice.payment_failed", {"id": "in_1", "customer": {"id": "c"}}), "customer"),
        (json.dumps({"id": "evt_1", "type": ["invoice.paid"]}).encode(), "event.type"),
        (json.dumps({"id": "evt_1", "type": "invoice.paid", "data": []}).encode(), "data"),
        (event("invoice.paid", ["in_1"]), "data.object"),
        (event("invoice.paid", {"id": "in_1", "customer": "cus_x"}, "e" * 400), "event.id"),
        (event("invoice.payment_failed", {"id": "i" * 400, "customer": "cus_x"}), "object.id"),
        (event("customer.deleted", {"id": 7}), "data.object.id"),
    ],
)
def test_odd_signed_payloads_are_400s_with_a_log_line_and_store_nothing(
    fake_stripe: StripeServer,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    payload: bytes,
    field: str,
) -> None:
    trip_on_failure(settings)
    set_up(fake_stripe, customer="cus_x")
    response = post(payload, sign(payload))
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_payload"
    assert field in response.json()["error"]["detail"]
    assert any("Stripe webhook refused" in r.getMessage() for r in caplog.records)
    assert StripeWebhookEvent.objects.count() == 0
    assert KillSwitch.objects.count() == 0


def test_a_database_error_text_is_never_stored_or_answered(
    fake_stripe: StripeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DataError

    cid = set_up(fake_stripe)

    def broken(*args: object, **kwargs: object) -> str:
        raise DataError('value too long for type character varying(255) "in_secret"')

    monkeypatch.setitem(webhooks.HANDLERS, "invoice.paid", broken)
    payload = event("invoice.paid", {"id": "in_1", "customer": cid})
    response = post(payload, sign(payload))
    assert response.status_code == 500  # stored, Stripe retries
    assert "in_secret" not in response.content.decode()
    row = StripeWebhookEvent.objects.get()
    assert row.error.startswith("DataError")
    assert "in_secret" not in row.error


def test_the_tenant_admin_page_names_the_invoices_the_switch_waits_on(
    fake_stripe: StripeServer, settings: Any, admin_client: Client
) -> None:
    from django.urls import reverse

    trip_on_failure(settings)
    cid = set_up(fake_stripe)
    deliver("invoice.payment_failed", "in_a", cid, "evt_1")
    deliver("invoice.payment_failed", "in_b", cid, "evt_2")
    deliver("invoice.paid", "in_a", cid, "evt_3")
    tenant = StripeCustomerLink.objects.get().tenant
    page = admin_client.get(reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]))
    assert "payment failed for invoice(s) in_b;" in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_a_stopped_links_failed_invoice() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before = [("llm_budgets", "0025_job_runs_for_health")]
    after = [("llm_budgets", "0026_stripe_invoices_the_payment_switch_waits_on")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    tenant = old.get_model("llm_budgets", "Tenant").objects.create(external_id="acme", name="A")
    switch = old.get_model("llm_budgets", "KillSwitch").objects.create(
        scope_key="tenant:acme", tenant=tenant, reason="r", tripped_at=timezone.now()
    )
    old.get_model("llm_budgets", "StripeCustomerLink").objects.create(
        tenant=tenant,
        customer_id="cus_1",
        linked_at=timezone.now(),
        payment_switch=switch,
        payment_failed_invoice="in_9",
    )
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    [invoice] = new.get_model("llm_budgets", "StripeInvoice").objects.all()
    assert (invoice.invoice_id, invoice.settled_at) == ("in_9", None)
    assert invoice.payment_failed_at == switch.tripped_at
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
