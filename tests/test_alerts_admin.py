"""The alerts admin (issue 28, item 4): endpoints created, changed and acted on through the
services (audited), the signing secret shown once, the delivery log and events read-only, and
every action refused to staff without the permission."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.alerts.endpoints import endpoint_create, endpoint_disable, endpoint_test_send
from llm_budgets.models import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    AuditEvent,
    Tenant,
)
from tests.test_admin import _logged_in

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/in"


def _url(name: str, *args: object) -> str:
    return reverse(f"admin:llm_budgets_{name}", args=args)


@pytest.fixture
def admin_client() -> Client:
    return _logged_in(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def viewer() -> Client:
    """Staff who may view the alert pages and change nothing."""
    client = _logged_in(username="viewer", is_staff=True)
    user = get_user_model().objects.get(username="viewer")
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_alertendpoint", "view_alertdelivery", "view_alertevent"]
        )
    )
    return client


@pytest.fixture
def acme() -> Tenant:
    budgets.ensure_tenant(tenant="acme", name="Acme")
    return Tenant.objects.get(external_id="acme")


def webhook(tenant: Tenant | None) -> AlertEndpoint:
    endpoint, _ = endpoint_create(
        tenant=tenant, kind="webhook", target=URL, event_types=["alert.test"]
    )
    return endpoint


def secrets_in(html: str) -> list[str]:
    return re.findall(r"llmbsec_[A-Za-z0-9_-]+", html)


def test_create_goes_through_the_service_and_shows_the_secret_once(
    admin_client: Client, acme: Tenant
) -> None:
    response = admin_client.post(
        _url("alertendpoint_add"),
        {
            "tenant": acme.pk,
            "kind": "webhook",
            "target": URL,
            "event_types": ["threshold.crossed", "budget.exhausted"],
            "description": "ops",
            "contact_emails": "",
        },
    )
    assert response.status_code == 200, response.content
    endpoint = AlertEndpoint.objects.get()
    page = response.content.decode()
    assert secrets_in(page) == [endpoint.secret]
    assert "no-store" in response["Cache-Control"]
    assert not list(get_messages(response.wsgi_request))  # not in a cookie or the session
    assert endpoint.event_types == ["threshold.crossed", "budget.exhausted"]
    assert AuditEvent.objects.filter(action="alert_endpoint.create", actor="admin").count() == 1
    for later in (
        admin_client.get(_url("alertendpoint_change", endpoint.pk)),
        admin_client.get(_url("alertendpoint_changelist")),
    ):
        assert later.status_code == 200
        assert secrets_in(later.content.decode()) == []
        assert endpoint.secret not in later.content.decode()


def test_create_refuses_what_the_service_refuses_beside_the_field(
    admin_client: Client, acme: Tenant
) -> None:
    response = admin_client.post(
        _url("alertendpoint_add"),
        {"tenant": acme.pk, "kind": "webhook", "target": "ftp://x", "event_types": ["run.closed"]},
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "target": ["target must be an https:// URL with a host."]
    }
    assert AlertEndpoint.objects.count() == 0


def test_change_goes_through_endpoint_update_and_cannot_change_kind(
    admin_client: Client, acme: Tenant
) -> None:
    endpoint = webhook(acme)
    response = admin_client.post(
        _url("alertendpoint_change", endpoint.pk),
        {
            "kind": "slack",
            "target": "https://hooks.example.com/other",
            "event_types": ["run.closed"],
            "description": "moved",
            "contact_emails": "ops@acme.example",
            "_save": "1",
        },
    )
    assert response.status_code == 302, response.content
    endpoint.refresh_from_db()
    assert (endpoint.kind, endpoint.target, endpoint.event_types) == (
        "webhook",
        "https://hooks.example.com/other",
        ["run.closed"],
    )
    audit = AuditEvent.objects.get(action="alert_endpoint.update")
    assert audit.before["target"] == URL
    assert audit.actor == "admin"


def test_rotate_shows_the_new_secret_once_and_keeps_the_old_for_the_overlap(
    admin_client: Client, acme: Tenant
) -> None:
    endpoint = webhook(acme)
    old = endpoint.secret
    url = _url("alertendpoint_rotate", endpoint.pk)
    asked = admin_client.get(url)
    assert asked.status_code == 200
    assert secrets_in(asked.content.decode()) == []
    response = admin_client.post(url, {"overlap_seconds": "3600"})
    assert response.status_code == 200
    endpoint.refresh_from_db()
    assert endpoint.previous_secret == old
    assert secrets_in(response.content.decode()) == [endpoint.secret]
    assert "no-store" in response["Cache-Control"]
    assert AuditEvent.objects.filter(action="alert_endpoint.rotate_secret").count() == 1


def test_disable_asks_a_reason_then_enable_sends_again(admin_client: Client, acme: Tenant) -> None:
    endpoint = webhook(acme)
    page = admin_client.get(_url("alertendpoint_change", endpoint.pk)).content.decode()
    assert _url("alertendpoint_disable", endpoint.pk) in page
    assert _url("alertendpoint_rotate", endpoint.pk) in page
    refused = admin_client.post(_url("alertendpoint_disable", endpoint.pk), {"reason": ""})
    assert refused.status_code == 200
    assert AlertEndpoint.objects.get().enabled
    admin_client.post(_url("alertendpoint_disable", endpoint.pk), {"reason": "receiver down"})
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.disabled_reason) == (False, "receiver down")
    listed = admin_client.get(_url("alertendpoint_changelist")).content.decode()
    assert "disabled: receiver down" in listed
    admin_client.post(_url("alertendpoint_enable", endpoint.pk), {})
    endpoint.refresh_from_db()
    assert endpoint.enabled


def test_send_test_queues_one_delivery_for_that_endpoint(
    admin_client: Client, acme: Tenant
) -> None:
    endpoint = webhook(acme)
    webhook(acme)  # also subscribed to alert.test: must not get this one
    response = admin_client.post(_url("alertendpoint_test", endpoint.pk), {})
    assert response.status_code == 302
    delivery = AlertDelivery.objects.get()
    assert (delivery.endpoint_id, delivery.event.type) == (endpoint.pk, "alert.test")
    (message,) = get_messages(response.wsgi_request)
    assert delivery.event.uid in str(message)


def test_list_actions_disable_with_a_reason_and_send_tests(
    admin_client: Client, acme: Tenant
) -> None:
    one, two = webhook(acme), webhook(None)
    changelist = _url("alertendpoint_changelist")
    selected = {"_selected_action": [one.pk, two.pk]}
    asked = admin_client.post(changelist, {**selected, "action": "disable_selected"})
    assert asked.status_code == 200
    assert "Disable these endpoints" in asked.content.decode()
    assert AlertEndpoint.objects.filter(enabled=True).count() == 2
    done = admin_client.post(
        changelist, {**selected, "action": "disable_selected", "reason": "migration"}
    )
    assert done.status_code == 302
    assert list(AlertEndpoint.objects.values_list("disabled_reason", flat=True)) == [
        "migration",
        "migration",
    ]
    admin_client.post(changelist, {**selected, "action": "send_test"})
    assert AlertDelivery.objects.count() == 2


def test_redeliver_queues_the_same_delivery_once_more(admin_client: Client, acme: Tenant) -> None:
    endpoint = webhook(acme)
    endpoint_test_send(endpoint)
    delivery = AlertDelivery.objects.get()
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        state=AlertDeliveryState.FAILED, attempts=5, last_status_code=503, last_error="down"
    )
    listed = admin_client.get(_url("alertdelivery_changelist")).content.decode()
    assert "5 (HTTP 503)" in listed
    response = admin_client.post(
        _url("alertdelivery_changelist"),
        {"_selected_action": [delivery.pk], "action": "redeliver"},
    )
    assert response.status_code == 302
    assert AlertDelivery.objects.count() == 1
    again = AlertDelivery.objects.get()
    assert (again.uid, again.state, again.attempts) == (delivery.uid, "pending", 5)
    assert AuditEvent.objects.filter(action="alert_delivery.redeliver", actor="admin").count() == 1


def test_a_deliverys_page_redelivers_it_after_saying_what_happens(
    admin_client: Client, acme: Tenant
) -> None:
    endpoint_test_send(webhook(acme))
    delivery = AlertDelivery.objects.get()
    AlertDelivery.objects.filter(pk=delivery.pk).update(state=AlertDeliveryState.DELIVERED)
    url = _url("alertdelivery_redeliver", delivery.pk)
    assert url in admin_client.get(_url("alertdelivery_change", delivery.pk)).content.decode()
    asked = admin_client.get(url)
    assert "same delivery id" in asked.content.decode()
    assert AlertDelivery.objects.get().state == "delivered"
    assert admin_client.post(url, {}).status_code == 302
    assert AlertDelivery.objects.get().state == "pending"
    assert AlertDelivery.objects.count() == 1


def test_pages_render_with_times_formatted_and_no_raw_datetimes(
    admin_client: Client, acme: Tenant
) -> None:
    endpoint = webhook(acme)
    endpoint_disable(endpoint, reason="<b>not bold</b>")
    event = endpoint_test_send(endpoint, actor="<i>who</i>")
    delivery = AlertDelivery.objects.get()
    pages = [
        _url("alertendpoint_changelist"),
        _url("alertendpoint_change", endpoint.pk),
        _url("alertdelivery_changelist"),
        _url("alertdelivery_change", delivery.pk),
        _url("alertevent_changelist"),
        _url("alertevent_change", event.pk),
        _url("alertdelivery_changelist") + f"?endpoint__id__exact={endpoint.pk}",
        _url("alertdelivery_changelist") + f"?event__id__exact={event.pk}",
    ]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "<b>not bold</b>" not in html, url
        assert "<i>who</i>" not in html, url
        # Django's own datetime rendering ("Dec. 5, 2026, 1:02 a.m.") never shows.
        assert not re.search(r"\b[ap]\.m\.", html), url
    event_page = admin_client.get(_url("alertevent_change", event.pk)).content.decode()
    assert "&lt;i&gt;who&lt;/i&gt;" in event_page


def test_delivery_and_event_pages_are_read_only(admin_client: Client, acme: Tenant) -> None:
    event = endpoint_test_send(webhook(acme))
    delivery = AlertDelivery.objects.get()
    for name, obj in (("alertdelivery", delivery), ("alertevent", event)):
        assert admin_client.get(_url(f"{name}_add")).status_code == 403
        assert admin_client.get(_url(f"{name}_delete", obj.pk)).status_code == 403
        assert admin_client.post(_url(f"{name}_change", obj.pk), {}).status_code == 403


def test_staff_without_change_permission_cannot_act(viewer: Client, acme: Tenant) -> None:
    endpoint = webhook(acme)
    endpoint_test_send(endpoint)
    delivery = AlertDelivery.objects.get()
    assert viewer.get(_url("alertendpoint_changelist")).status_code == 200
    page = viewer.get(_url("alertendpoint_change", endpoint.pk)).content.decode()
    assert _url("alertendpoint_rotate", endpoint.pk) not in page
    for action in ("rotate", "disable", "enable", "test"):
        url = _url(f"alertendpoint_{action}", endpoint.pk)
        assert viewer.get(url).status_code == 403, action
        assert viewer.post(url, {"reason": "x", "overlap_seconds": "0"}).status_code == 403
    assert viewer.get(_url("alertendpoint_add")).status_code == 403
    assert viewer.post(_url("alertdelivery_redeliver", delivery.pk), {}).status_code == 403
    detail = viewer.get(_url("alertdelivery_change", delivery.pk)).content.decode()
    assert _url("alertdelivery_redeliver", delivery.pk) not in detail
    viewer.post(
        _url("alertdelivery_changelist"),
        {"_selected_action": [delivery.pk], "action": "redeliver"},
    )
    endpoint.refresh_from_db()
    assert endpoint.enabled
    assert AuditEvent.objects.filter(action__startswith="alert_delivery").count() == 0
    assert AlertEvent.objects.count() == 1


def test_delete_goes_through_the_service_one_or_many(admin_client: Client, acme: Tenant) -> None:
    one, two, three = webhook(acme), webhook(acme), webhook(None)
    endpoint_test_send(one)
    response = admin_client.post(_url("alertendpoint_delete", one.pk), {"post": "yes"})
    assert response.status_code == 302
    admin_client.post(
        _url("alertendpoint_changelist"),
        {"_selected_action": [two.pk, three.pk], "action": "delete_selected", "post": "yes"},
    )
    assert AlertEndpoint.objects.count() == 0
    assert AuditEvent.objects.filter(action="alert_endpoint.delete", actor="admin").count() == 3
    assert AlertEvent.objects.count() == 1  # the events stay


def test_an_email_endpoint_awaiting_confirmation_says_so_and_is_not_enabled(
    admin_client: Client, acme: Tenant
) -> None:
    # A tenant added the address (confirm_site): staff see it waits, and enabling it is refused
    # with the reason, one by one or from the list, not a server error.
    endpoint, _ = endpoint_create(
        tenant=acme,
        kind="email",
        target="ops@acme.example",
        event_types=["run.closed"],
        confirm_site="https://host.example/",
    )
    page = admin_client.get(_url("alertendpoint_change", endpoint.pk)).content.decode()
    assert "ops@acme.example: added by the tenant, each was emailed a link" in page
    answer = admin_client.post(_url("alertendpoint_enable", endpoint.pk), {})
    assert answer.status_code == 302
    (message,) = get_messages(answer.wsgi_request)
    assert "No address of this endpoint has confirmed yet" in str(message)
    listed = admin_client.post(
        _url("alertendpoint_changelist"),
        {"_selected_action": [endpoint.pk], "action": "enable_selected"},
    )
    assert listed.status_code == 302
    assert any("no address has confirmed yet" in str(m) for m in get_messages(listed.wsgi_request))
    endpoint.refresh_from_db()
    assert not endpoint.enabled
