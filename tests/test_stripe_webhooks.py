"""Stripe webhooks (issue 11, item 6): signature first, stored raw, processed once, errors
stored and answered 5xx; payment failed / paid round trip; customer deleted; meter errors;
signed events this app cannot read stored unprocessable, answered 200, reprocessed by staff
(issue 38, item 4)."""

from __future__ import annotations

import copy as copy_module
import html
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.billing import webhook_shapes, webhooks
from llm_budgets.billing.credits import account_of, balance_state
from llm_budgets.models import (
    AuditEvent,
    CreditLot,
    KillSwitch,
    MeterDelivery,
    MeterErrorReport,
    StripeCustomerLink,
    StripeInvoice,
    StripeWebhookEvent,
    TopUp,
)
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.prepaid_support import pay, prepaid
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
    assert (bytes(row.body), row.state) == (failed, "processed")
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


# The payment switch follows the right invoices (issue 22 item 4).


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


# Signed events this app cannot read: stored unprocessable with the reason, answered 200, nothing
# acted on; staff reprocess them from the admin (issue 38, item 4).

GONE = object()  # a field left out


@dataclass
class Paid:
    """acme, prepaid and linked: one top-up credited (refunds and disputes name its payment),
    one paid whose events are not delivered yet (the odd shapes are made from them)."""

    customer: str
    credited: TopUp
    pending: TopUp
    checkout: dict[str, Any]
    intent: dict[str, Any]

    @property
    def paid_intent(self) -> str:
        return str(self.credited.payment_intent_id)


@pytest.fixture
def paid(fake_stripe: StripeServer, settings: Any) -> Paid:
    trip_on_failure(settings)
    customer = prepaid(fake_stripe)
    credited, events = pay(fake_stripe, "100")
    assert all(deliver_event(e) == 200 for e in events)
    pending, (checkout, intent) = pay(fake_stripe, "50")
    credited.refresh_from_db()
    return Paid(customer, credited, pending, checkout, intent)


def deliver_event(event: dict[str, Any]) -> int:
    payload = json.dumps(event).encode()
    return int(post(payload, sign(payload)).status_code)


def changed(event: dict[str, Any], path: str, value: object) -> bytes:
    """``event`` with the field at dotted ``path`` set to ``value`` (or removed: GONE)."""
    copy = copy_module.deepcopy(event)
    *parents, last = path.split(".")
    target = copy
    for key in parents:
        target = target[key]
    if value is GONE:
        del target[last]
    else:
        target[last] = value
    return json.dumps(copy).encode()


def made(kind: str, obj: object, event_id: str = "evt_odd") -> bytes:
    event = {"id": event_id, "object": "event", "type": kind, "data": {"object": obj}}
    return json.dumps(event).encode()


def logged_in(*permissions: str, superuser: bool = False) -> Client:
    """Staff "carol" (no password: hashing one costs more than the rest of a test)."""
    user = get_user_model().objects.create_user(
        username="carol", password=None, is_staff=True, is_superuser=superuser
    )
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def nested(levels: int) -> object:
    value: object = "1"
    for _ in range(levels):
        value = {"a": value}
    return value


def swapped(payload: bytes, marker: str, raw: bytes) -> bytes:
    """``payload`` with the JSON string ``marker`` replaced by ``raw`` bytes (what json.dumps
    cannot write: huge integers, NaN, control characters)."""
    assert json.dumps(marker).encode() in payload
    return payload.replace(json.dumps(marker).encode(), raw)


ODD: list[tuple[str, Callable[[Paid], bytes], str]] = [
    # The nine of the issue (each a 500 on PostgreSQL before).
    ("NUL in id", lambda p: changed(p.checkout, "id", "evt_\x00x"), "id"),
    ("NUL in type", lambda p: changed(p.intent, "type", "payment_intent.succeeded\x00"), "type"),
    (
        "NUL in an invoice id",
        lambda p: made("invoice.payment_failed", {"id": "in_\x00", "customer": p.customer}),
        "data.object.id",
    ),
    (
        "NUL in a dispute's payment_intent",
        lambda p: made(
            "charge.dispute.created",
            {"id": "dp_1", "payment_intent": p.paid_intent + "\x00", "amount": 10000},
        ),
        "data.object.payment_intent",
    ),
    (
        "a lone surrogate in a customer",
        lambda p: made("invoice.payment_failed", {"id": "in_1", "customer": p.customer + "\ud800"}),
        "data.object.customer",
    ),
    (
        "metadata a list",
        lambda p: changed(p.checkout, "data.object.metadata", ["llmb_top_up"]),
        "data.object.metadata",
    ),
    (
        "metadata a string",
        lambda p: changed(p.intent, "data.object.metadata", f"llmb_top_up={p.pending.pk}"),
        "data.object.metadata",
    ),
    (
        "llmb_top_up ²",
        lambda p: changed(p.intent, "data.object.metadata.llmb_top_up", "²"),
        "data.object.metadata.llmb_top_up",
    ),
    (
        "llmb_top_up of 5,000 digits",
        lambda p: changed(p.checkout, "data.object.metadata.llmb_top_up", "1" * 5000),
        "data.object.metadata.llmb_top_up",
    ),
    # The ten that were 400s (Stripe retries those for days too).
    (
        "nested 5,000 deep",
        lambda p: (
            b'{"id": "evt_deep", "type": "invoice.paid", "data": {"object": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}}"
        ),
        "body",
    ),
    (
        "an invoice id a list",
        lambda p: made("invoice.paid", {"id": ["in_1"], "customer": p.customer}),
        "data.object.id",
    ),
    (
        "a customer a list",
        lambda p: made("invoice.paid", {"id": "in_1", "customer": [p.customer]}),
        "data.object.customer",
    ),
    (
        "a customer an object",
        lambda p: made("invoice.payment_failed", {"id": "in_1", "customer": {"id": p.customer}}),
        "data.object.customer",
    ),
    ("type a list", lambda p: changed(p.intent, "type", ["payment_intent.succeeded"]), "type"),
    ("data a list", lambda p: changed(p.intent, "data", [p.intent["data"]]), "data"),
    ("data.object a list", lambda p: changed(p.intent, "data.object", []), "data.object"),
    ("an id of 400 characters", lambda p: changed(p.intent, "id", "e" * 400), "id"),
    (
        "an invoice id of 400 characters",
        lambda p: made("invoice.payment_failed", {"id": "i" * 400, "customer": p.customer}),
        "data.object.id",
    ),
    ("a customer id a number", lambda p: made("customer.deleted", {"id": 7}), "data.object.id"),
    # More: every field a handler reads, with the wrong type or out of reach.
    ("a lone surrogate in id", lambda p: changed(p.checkout, "id", "evt_\udc00"), "id"),
    ("no id", lambda p: changed(p.intent, "id", GONE), "id"),
    ("an empty id", lambda p: changed(p.intent, "id", ""), "id"),
    ("type a number", lambda p: changed(p.intent, "type", 7), "type"),
    ("not JSON", lambda p: b"not json", "body"),
    ("a JSON list", lambda p: json.dumps([p.intent]).encode(), "body"),
    (
        "a raw NUL byte in a string",
        lambda p: swapped(changed(p.intent, "id", "MARK"), "MARK", b'"evt_\x00"'),
        "body",
    ),
    (
        "an amount of 5,000 digits",
        lambda p: swapped(
            changed(p.checkout, "data.object.amount_total", "MARK"), "MARK", b"9" * 5000
        ),
        "body",
    ),
    (
        "an amount of 30 digits",
        lambda p: changed(p.checkout, "data.object.amount_total", 10**30),
        "data.object.amount_total",
    ),
    (
        "an amount NaN",
        lambda p: swapped(changed(p.checkout, "data.object.amount_total", "MARK"), "MARK", b"NaN"),
        "data.object.amount_total",
    ),
    (
        "an amount with a fraction",
        lambda p: changed(p.checkout, "data.object.amount_total", 5000.0),
        "data.object.amount_total",
    ),
    (
        "an amount a boolean",
        lambda p: changed(p.checkout, "data.object.amount_total", True),
        "data.object.amount_total",
    ),
    (
        "an amount a string",
        lambda p: changed(p.intent, "data.object.amount_received", "5000"),
        "data.object.amount_received",
    ),
    (
        "an amount below zero",
        lambda p: changed(p.intent, "data.object.amount_received", -5000),
        "data.object.amount_received",
    ),
    (
        "no amount",
        lambda p: changed(p.intent, "data.object.amount_received", GONE),
        "data.object.amount_received",
    ),
    (
        "a currency a number",
        lambda p: changed(p.intent, "data.object.currency", 840),
        "data.object.currency",
    ),
    (
        "a top-up's customer null",
        lambda p: changed(p.intent, "data.object.customer", None),
        "data.object.customer",
    ),
    (
        "a payment intent id a list",
        lambda p: changed(p.intent, "data.object.id", [p.intent["data"]["object"]["id"]]),
        "data.object.id",
    ),
    (
        "a payment method a list",
        lambda p: changed(p.intent, "data.object.payment_method", ["pm_card_visa"]),
        "data.object.payment_method",
    ),
    (
        "a payment status an object",
        lambda p: changed(p.checkout, "data.object.payment_status", {"paid": True}),
        "data.object.payment_status",
    ),
    (
        "NUL in a checkout's payment_intent",
        lambda p: changed(p.checkout, "data.object.payment_intent", "pi_\x00"),
        "data.object.payment_intent",
    ),
    (
        "llmb_top_up a number",
        lambda p: changed(p.intent, "data.object.metadata.llmb_top_up", p.pending.pk),
        "data.object.metadata.llmb_top_up",
    ),
    (
        "llmb_top_up in fullwidth digits",
        lambda p: changed(p.intent, "data.object.metadata.llmb_top_up", "\uff11"),
        "data.object.metadata.llmb_top_up",
    ),
    (
        "llmb_top_up nested 60 deep",
        lambda p: changed(p.checkout, "data.object.metadata.llmb_top_up", nested(60)),
        "data.object.metadata.llmb_top_up",
    ),
    (
        "a refund's payment_intent a list",
        lambda p: made(
            "charge.refunded",
            {"id": "ch_1", "payment_intent": [p.paid_intent], "amount_refunded": 1},
        ),
        "data.object.payment_intent",
    ),
    (
        "a refund without its amount",
        lambda p: made("charge.refunded", {"id": "ch_1", "payment_intent": p.paid_intent}),
        "data.object.amount_refunded",
    ),
    (
        "a dispute's amount a string",
        lambda p: made(
            "charge.dispute.created", {"id": "dp_1", "payment_intent": p.paid_intent, "amount": "1"}
        ),
        "data.object.amount",
    ),
    (
        "an invoice event without its object",
        lambda p: changed(json.loads(made("invoice.paid", {})), "data", {}),
        "data.object.id",
    ),
    (
        "NUL in a meter error's message",
        lambda p: json.dumps(
            {
                "id": "evt_meter",
                "type": "v1.billing.meter.error_report_triggered",
                "data": {
                    "reason": {
                        "error_types": [
                            {
                                "code": "meter_event_customer_not_found",
                                "sample_errors": [
                                    {"error_message": "no\x00", "request": {"identifier": "x"}}
                                ],
                            }
                        ]
                    }
                },
            }
        ).encode(),
        "data.reason.error_types.0.sample_errors.0.error_message",
    ),
    (
        "a meter report's data a list",
        lambda p: json.dumps(
            {"id": "evt_meter", "type": "v1.billing.meter.no_meter_found", "data": []}
        ).encode(),
        "data",
    ),
    (
        "NUL in the id of an event no handler reads",
        lambda p: json.dumps({"id": "evt_\x00", "type": "customer.updated"}).encode(),
        "id",
    ),
]


def reprocess(client: Client, *ids: str) -> Any:
    return client.post(
        reverse("admin:llm_budgets_stripewebhookevent_changelist"),
        {"action": "reprocess", "_selected_action": list(ids)},
    )


def nothing_acted_on(paid: Paid, fake: StripeServer) -> None:
    """No credit, no take-back, no switch, no invoice, no report, no unlink: as before."""
    paid.pending.refresh_from_db()
    paid.credited.refresh_from_db()
    assert paid.pending.state != "credited"
    assert (paid.credited.state, paid.credited.refunded) == ("credited", 0)
    assert CreditLot.objects.count() == 1
    assert len(fake.live_grants(paid.customer)) == 1
    assert balance_state(account_of("acme")).credit == Decimal(100)
    assert not KillSwitch.objects.exists()
    assert not StripeInvoice.objects.exists()
    assert not MeterErrorReport.objects.exists()
    assert StripeCustomerLink.objects.get().active


@pytest.mark.parametrize(("shape", "field"), [(s, f) for s, _, f in ODD], ids=[s for s, *_ in ODD])
def test_a_signed_event_this_app_cannot_read_is_stored_unprocessable_and_answered_200(
    fake_stripe: StripeServer,
    paid: Paid,
    caplog: pytest.LogCaptureFixture,
    shape: str,
    field: str,
) -> None:
    payload = next(build for s, build, _ in ODD if s == shape)(paid)
    before = set(StripeWebhookEvent.objects.values_list("pk", flat=True))
    response = post(payload, sign(payload))
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["state"] == "unprocessable"
    assert answer["reason"].startswith(f"{field} ")
    row = StripeWebhookEvent.objects.exclude(pk__in=before).get()
    assert answer["received"] == row.pk
    assert bytes(row.body) == payload  # byte for byte
    assert (row.state, row.processed_at, row.attempts) == ("unprocessable", None, 1)
    assert row.error.startswith(f"{field} ")
    assert any("unprocessable" in r.getMessage() for r in caplog.records)
    nothing_acted_on(paid, fake_stripe)
    # Staff reprocess it: read again, still unprocessable, still nothing acted on.
    assert reprocess(logged_in(superuser=True), row.pk).status_code == 302
    row.refresh_from_db()
    assert (row.state, row.attempts) == ("unprocessable", 2)
    assert row.error.startswith(f"{field} ")
    assert AuditEvent.objects.filter(action="stripe.webhook_reprocess").count() == 1
    nothing_acted_on(paid, fake_stripe)
    # Stripe delivers it again (a retry, or a replay): the same row, nothing more.
    assert post(payload, sign(payload)).status_code == 200
    assert StripeWebhookEvent.objects.exclude(pk__in=before).get().attempts == 2
    nothing_acted_on(paid, fake_stripe)
    # And the real events still credit the pending top-up, once.
    assert all(deliver_event(e) == 200 for e in (paid.checkout, paid.intent, paid.intent))
    paid.pending.refresh_from_db()
    assert paid.pending.state == "credited"
    assert balance_state(account_of("acme")).credit == Decimal(150)


def test_every_event_type_handled_has_its_fields_checked() -> None:
    assert set(webhook_shapes.READERS) == set(webhooks.HANDLERS)


def test_staff_reprocess_an_event_once_a_release_reads_it(
    fake_stripe: StripeServer, paid: Paid, monkeypatch: pytest.MonkeyPatch
) -> None:
    def older_release(event: dict[str, Any]) -> None:
        raise webhook_shapes.WebhookPayloadError(
            "data.object.metadata must be an object; got a list.", field="data.object.metadata"
        )

    monkeypatch.setitem(webhook_shapes.READERS, "payment_intent.succeeded", older_release)
    assert deliver_event(paid.intent) == 200
    row = StripeWebhookEvent.objects.get(pk=paid.intent["id"])
    assert row.state == "unprocessable"
    nothing_acted_on(paid, fake_stripe)
    monkeypatch.undo()  # the release that reads it
    url = reverse("admin:llm_budgets_stripewebhookevent_changelist")
    viewer = logged_in("view_stripewebhookevent")
    assert (
        viewer.post(url, {"action": "reprocess", "_selected_action": [row.pk]}).status_code == 200
    )
    row.refresh_from_db()
    assert row.state == "unprocessable"  # no permission: no action
    get_user_model().objects.all().delete()
    staff = logged_in("view_stripewebhookevent", "reprocess_stripewebhookevent")
    listed = staff.get(
        reverse("admin:llm_budgets_stripewebhookevent_changelist") + "?state__exact=unprocessable"
    ).content.decode()
    assert row.pk in listed
    assert paid.credited.credited_by_event not in listed  # processed: not in this list
    # The admin quotes a key in its URLs ("_26" would read as "&"): as its own links do.
    page = staff.get(reverse("admin:llm_budgets_stripewebhookevent_change", args=[quote(row.pk)]))
    assert "data.object.metadata must be an object" in page.content.decode()
    assert html.escape(paid.intent["data"]["object"]["id"]) in page.content.decode()  # the body
    assert reprocess(staff, row.pk).status_code == 302
    row.refresh_from_db()
    assert (row.state, row.error, row.attempts) == ("processed", "", 2)
    assert row.outcome.startswith(f"credited top-up {paid.pending.pk}")
    audit = AuditEvent.objects.get(action="stripe.webhook_reprocess")
    assert (audit.actor, audit.before["state"], audit.after["state"]) == (
        "carol",
        "unprocessable",
        "processed",
    )
    # Reprocessed again, redelivered by Stripe, its twin delivered: credited once.
    assert reprocess(staff, row.pk).status_code == 302
    assert deliver_event(paid.intent) == 200
    assert deliver_event(paid.checkout) == 200
    assert CreditLot.objects.filter(top_up=paid.pending).count() == 1
    assert len(fake_stripe.live_grants(paid.customer)) == 2
    assert balance_state(account_of("acme")).credit == Decimal(150)
    row.refresh_from_db()
    assert row.attempts == 2


def test_a_failed_event_reprocessed_and_one_a_new_release_cannot_read(
    fake_stripe: StripeServer, paid: Paid, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff = logged_in(superuser=True)

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("grant service down")

    monkeypatch.setitem(webhooks.HANDLERS, "payment_intent.succeeded", broken)
    assert deliver_event(paid.intent) == 500  # stored; Stripe retries
    row = StripeWebhookEvent.objects.get(pk=paid.intent["id"])
    assert (row.state, row.attempts) == ("received", 1)
    assert "grant service down" in row.error
    # Reprocessing while still broken keeps it received (Stripe still retries it).
    reprocess(staff, row.pk)
    row.refresh_from_db()
    assert (row.state, row.attempts) == ("received", 2)
    # A release that cannot read the body: Stripe's retry stores it unprocessable, answered 200.
    monkeypatch.setitem(
        webhook_shapes.READERS,
        "payment_intent.succeeded",
        _raising(webhook_shapes.WebhookPayloadError("data.object is odd.", field="data.object")),
    )
    assert deliver_event(paid.intent) == 200
    row.refresh_from_db()
    assert (row.state, row.error) == ("unprocessable", "data.object is odd.")
    monkeypatch.undo()
    reprocess(staff, row.pk)
    row.refresh_from_db()
    assert row.state == "processed"
    assert CreditLot.objects.filter(top_up=paid.pending).count() == 1
    assert balance_state(account_of("acme")).credit == Decimal(150)


def _raising(exc: Exception) -> Callable[[dict[str, Any]], None]:
    def check(event: dict[str, Any]) -> None:
        raise exc

    return check


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_each_body_byte_for_byte_and_marks_the_processed_events() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before = [("llm_budgets", "0035_job_run_failures")]
    after = [("llm_budgets", "0036_stripe_webhook_events_raw_body_and_state")]
    now = timezone.now()
    # Backslashes and non-ASCII text: PostgreSQL's text::bytea would read "\\x41" as an escape.
    text = json.dumps({"id": "evt_1", "name": "café \\x41 \\\\ \u00e9"}, ensure_ascii=False)
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("llm_budgets", "StripeWebhookEvent")
    old.objects.create(
        id="evt_1", type="invoice.paid", payload=text, received_at=now, processed_at=now
    )
    old.objects.create(id="evt_2", type="invoice.paid", payload="{}", received_at=now, error="x")
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps.get_model("llm_budgets", "StripeWebhookEvent")
    rows = {row.id: (bytes(row.body), row.state) for row in new.objects.all()}
    assert rows == {"evt_1": (text.encode(), "processed"), "evt_2": (b"{}", "received")}
    executor = MigrationExecutor(connection)
    executor.migrate(before)  # and back
    old = executor.loader.project_state(before).apps.get_model("llm_budgets", "StripeWebhookEvent")
    assert dict(old.objects.values_list("id", "payload")) == {"evt_1": text, "evt_2": "{}"}
    old.objects.all().delete()
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
