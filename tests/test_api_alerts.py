"""REST API for alerts (issue 28, item 4): endpoints, deliveries and events; operator keys for
installation-wide endpoints and any tenant's, tenant keys for their own; secrets shown once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core import mail, signing
from django.test import Client, override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.alerts.delivery import alerts_deliver
from llm_budgets.alerts.endpoints import (
    AWAITING_CONFIRMATION,
    endpoint_create,
    endpoint_disable,
    warning_recipients,
)
from llm_budgets.models import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    AuditEvent,
    Tenant,
)
from tests.alerts_receiver import Receiver, receiver_running
from tests.api import BASE, client_for, new_key

pytestmark = pytest.mark.django_db

ENDPOINTS = f"{BASE}alerts/endpoints"
DELIVERIES = f"{BASE}alerts/deliveries"
EVENTS = f"{BASE}alerts/events"
URL = "https://hooks.example.com/in"


@pytest.fixture
def keys() -> dict[str, str]:
    budgets.ensure_tenant(tenant="acme", name="Acme")
    budgets.ensure_tenant(tenant="globex", name="Globex")
    return {
        "operator": new_key(None, name="ops"),
        "acme": new_key("acme", name="acme-app"),
        "globex": new_key("globex", name="globex-app"),
    }


def create(key: str, **body: Any) -> Any:
    body.setdefault("kind", "webhook")
    body.setdefault("target", URL)
    body.setdefault("event_types", ["threshold.crossed"])
    return client_for(key).post(ENDPOINTS, body, format="json")


def error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def endpoint_of(tenant: str | None, kind: str = "webhook") -> AlertEndpoint:
    owner = Tenant.objects.get(external_id=tenant) if tenant else None
    endpoint, _ = endpoint_create(
        tenant=owner, kind=kind, target=URL, event_types=["alert.test", "threshold.crossed"]
    )
    return endpoint


def test_a_tenant_key_creates_its_own_webhook_and_sees_the_secret_only_in_that_answer(
    keys: dict[str, str],
) -> None:
    response = create(keys["acme"], description="ops channel")
    assert response.status_code == 201, response.content
    made = response.json()
    assert made["tenant"] == "acme"
    assert made["secret"].startswith("llmbsec_")
    assert made["secret_hint"] == "…" + made["secret"][-4:]
    endpoint = AlertEndpoint.objects.get(pk=made["id"])
    assert endpoint.secret == made["secret"]
    assert AuditEvent.objects.filter(action="alert_endpoint.create", actor__contains="acme-app")

    shown = client_for(keys["acme"]).get(f"{ENDPOINTS}/{made['id']}")
    listed = client_for(keys["acme"]).get(ENDPOINTS)
    changed = client_for(keys["acme"]).patch(
        f"{ENDPOINTS}/{made['id']}", {"description": "x"}, format="json"
    )
    rows = [shown.json(), listed.json()["results"][0], changed.json()]
    assert [row["id"] for row in rows] == [made["id"]] * 3
    for row in rows:
        assert "secret" not in row
        assert made["secret"] not in str(row)


def test_rotate_returns_a_new_secret_once_and_keeps_the_old_one_for_the_overlap(
    keys: dict[str, str],
) -> None:
    endpoint = endpoint_of("acme")
    old = endpoint.secret
    response = client_for(keys["acme"]).post(
        f"{ENDPOINTS}/{endpoint.pk}/rotate-secret", {"overlap_seconds": 600}, format="json"
    )
    assert response.status_code == 200, response.content
    new = response.json()["secret"]
    assert new.startswith("llmbsec_")
    assert new != old
    endpoint.refresh_from_db()
    assert (endpoint.secret, endpoint.previous_secret) == (new, old)
    again = client_for(keys["acme"]).get(f"{ENDPOINTS}/{endpoint.pk}")
    assert new not in again.content.decode()


def test_a_rotation_overlap_has_a_maximum(keys: dict[str, str]) -> None:
    endpoint = endpoint_of("acme")
    old = endpoint.secret
    acme = client_for(keys["acme"])
    rotate = f"{ENDPOINTS}/{endpoint.pk}/rotate-secret"
    for asked in (10**9, 7 * 24 * 3600 + 1, 10**30):
        response = acme.post(rotate, {"overlap_seconds": asked}, format="json")
        assert response.status_code == 400, response.content
        (says,) = error(response)["fields"]["overlap_seconds"]
        assert "from 0 to 604800" in says
        assert "ALERTS_SECRET_OVERLAP_MAX_SECONDS" in says
        endpoint.refresh_from_db()
        assert (endpoint.secret, endpoint.previous_secret) == (old, "")  # nothing written
    assert acme.post(rotate, {"overlap_seconds": 7 * 24 * 3600}, format="json").status_code == 200
    with override_settings(
        LLM_BUDGETS={**settings.LLM_BUDGETS, "ALERTS_SECRET_OVERLAP_MAX_SECONDS": 3600}
    ):
        assert acme.post(rotate, {"overlap_seconds": 3601}, format="json").status_code == 400


def test_a_tenants_endpoint_is_refused_operators_only_event_types_naming_them(
    keys: dict[str, str],
) -> None:
    types = ["threshold.crossed", "stripe.delivery_parked"]
    for key, body in [
        (keys["acme"], {}),
        (keys["operator"], {"tenant": "acme"}),  # the operators too: it would never arrive
    ]:
        response = create(key, event_types=types, **body)
        assert response.status_code == 400, response.content
        (says,) = error(response)["fields"]["event_types"]
        assert says.startswith("event_types: stripe.delivery_parked is for the operators'")
        assert "threshold.crossed" in says  # what may be chosen
    assert AlertEndpoint.objects.count() == 0
    assert create(keys["operator"], event_types=types).status_code == 201  # installation-wide
    endpoint = endpoint_of("acme")
    changed = client_for(keys["acme"]).patch(
        f"{ENDPOINTS}/{endpoint.pk}", {"event_types": types}, format="json"
    )
    assert changed.status_code == 400
    assert list(error(changed)["fields"]) == ["event_types"]
    endpoint.refresh_from_db()
    assert endpoint.event_types == ["alert.test", "threshold.crossed"]


def test_a_target_that_reaches_a_private_address_is_a_field_error(keys: dict[str, str]) -> None:
    for target in ("https://127.0.0.1/in", "https://[64:ff9b::7f00:1]/in", "https://localhost/x"):
        response = create(keys["acme"], target=target)
        assert response.status_code == 400, response.content
        (says,) = error(response)["fields"]["target"]
        assert "target is not allowed" in says
        assert "127.0.0.1" not in says
    assert AlertEndpoint.objects.count() == 0


def test_an_email_endpoint_has_no_secret_to_rotate(keys: dict[str, str]) -> None:
    response = create(keys["acme"], kind="email", target="ops@acme.example")
    assert response.status_code == 201, response.content
    assert response.json()["secret"] == ""
    rotated = client_for(keys["acme"]).post(
        f"{ENDPOINTS}/{response.json()['id']}/rotate-secret", {}, format="json"
    )
    assert rotated.status_code == 400
    assert error(rotated)["fields"] == {"kind": ["Only a webhook endpoint has a signing secret."]}


def test_an_operator_key_creates_installation_wide_endpoints_and_any_tenants(
    keys: dict[str, str],
) -> None:
    wide = create(keys["operator"])
    for_globex = create(keys["operator"], tenant="globex")
    assert (wide.status_code, for_globex.status_code) == (201, 201)
    assert wide.json()["tenant"] is None
    assert for_globex.json()["tenant"] == "globex"
    listed = client_for(keys["operator"]).get(ENDPOINTS, {"tenant": "-"}).json()
    assert [e["id"] for e in listed["results"]] == [wide.json()["id"]]
    unknown = create(keys["operator"], tenant="nobody")
    assert (unknown.status_code, error(unknown)["code"]) == (404, "unknown_tenant")


def test_a_tenant_key_gets_404_for_another_tenants_endpoint_by_every_route(
    keys: dict[str, str],
) -> None:
    theirs = endpoint_of("globex")
    wide = endpoint_of(None)
    acme = client_for(keys["acme"])
    for endpoint in (theirs, wide):
        base = f"{ENDPOINTS}/{endpoint.pk}"
        answers = [
            acme.get(base),
            acme.patch(base, {"description": "mine now"}, format="json"),
            acme.delete(base),
            acme.post(f"{base}/rotate-secret", {}, format="json"),
            acme.post(f"{base}/test", {}, format="json"),
            acme.post(f"{base}/disable", {"reason": "x"}, format="json"),
            acme.post(f"{base}/enable", {}, format="json"),
        ]
        for answer in answers:
            assert answer.status_code == 404, (answer.request, answer.content)
            assert error(answer)["code"] == "alert_endpoint_not_found"
            assert endpoint.secret not in answer.content.decode()
    untouched = AlertEndpoint.objects.get(pk=theirs.pk)
    assert (untouched.description, untouched.enabled, untouched.secret) == (
        "",
        True,
        theirs.secret,
    )
    assert AlertEvent.objects.count() == 0
    assert acme.get(ENDPOINTS).json()["results"] == []
    assert error(acme.get(ENDPOINTS, {"tenant": "globex"}))["code"] == "unknown_tenant"
    assert error(create(keys["acme"], tenant="globex"))["code"] == "unknown_tenant"


def test_a_tenant_key_sees_only_its_own_deliveries_and_events(keys: dict[str, str]) -> None:
    theirs = endpoint_of("globex")
    mine = endpoint_of("acme")
    client_for(keys["globex"]).post(f"{ENDPOINTS}/{theirs.pk}/test", {}, format="json")
    client_for(keys["acme"]).post(f"{ENDPOINTS}/{mine.pk}/test", {}, format="json")
    foreign = AlertDelivery.objects.get(endpoint=theirs)
    acme = client_for(keys["acme"])
    for answer in (
        acme.get(f"{DELIVERIES}/{foreign.uid}"),
        acme.post(f"{DELIVERIES}/{foreign.uid}/redeliver", {}, format="json"),
    ):
        assert answer.status_code == 404
        assert error(answer)["code"] == "alert_delivery_not_found"
    listed = acme.get(DELIVERIES).json()["results"]
    assert [d["endpoint"] for d in listed] == [mine.pk]
    events = acme.get(EVENTS).json()["results"]
    assert [e["tenant"] for e in events] == ["acme"]
    everything = client_for(keys["operator"]).get(DELIVERIES).json()["results"]
    assert {d["endpoint"] for d in everything} == {mine.pk, theirs.pk}


def test_test_event_is_queued_for_that_endpoint_alone(keys: dict[str, str]) -> None:
    endpoint = endpoint_of("acme")
    endpoint_of("acme")  # another endpoint of the same tenant, also subscribed to alert.test
    response = client_for(keys["acme"]).post(f"{ENDPOINTS}/{endpoint.pk}/test", {}, format="json")
    assert response.status_code == 202, response.content
    event = response.json()
    assert event["type"] == "alert.test"
    assert event["id"].startswith("evt_")
    deliveries = client_for(keys["acme"]).get(DELIVERIES, {"event": event["id"]}).json()
    assert [(d["endpoint"], d["state"]) for d in deliveries["results"]] == [
        (endpoint.pk, "pending")
    ]


def test_redeliver_queues_the_same_delivery_once_more_due_now(keys: dict[str, str]) -> None:
    endpoint = endpoint_of("acme")
    client_for(keys["acme"]).post(f"{ENDPOINTS}/{endpoint.pk}/test", {}, format="json")
    delivery = AlertDelivery.objects.get()
    # As the delivery job leaves one it gave up on.
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        state=AlertDeliveryState.FAILED, attempts=7, last_status_code=500, last_error="boom"
    )
    before = timezone.now()
    response = client_for(keys["acme"]).post(
        f"{DELIVERIES}/{delivery.uid}/redeliver", {}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["id"] == delivery.uid
    assert response.json()["state"] == "pending"
    assert AlertDelivery.objects.count() == 1
    again = AlertDelivery.objects.get()
    assert (again.uid, again.state, again.attempts) == (delivery.uid, "pending", 7)
    assert again.next_attempt_at >= before
    assert AuditEvent.objects.filter(action="alert_delivery.redeliver").count() == 1
    detail = client_for(keys["acme"]).get(f"{DELIVERIES}/{delivery.uid}").json()
    assert (detail["last_status_code"], detail["last_error"]) == (500, "boom")


def test_disable_needs_a_reason_and_enable_starts_the_failure_count_over(
    keys: dict[str, str],
) -> None:
    endpoint = endpoint_of("acme")
    acme = client_for(keys["acme"])
    missing = acme.post(f"{ENDPOINTS}/{endpoint.pk}/disable", {}, format="json")
    assert missing.status_code == 400
    assert error(missing)["field"] == "reason"
    off = acme.post(f"{ENDPOINTS}/{endpoint.pk}/disable", {"reason": "migrating"}, format="json")
    assert (off.json()["enabled"], off.json()["disabled_reason"]) == (False, "migrating")
    AlertEndpoint.objects.filter(pk=endpoint.pk).update(consecutive_failures=3)
    on = acme.post(f"{ENDPOINTS}/{endpoint.pk}/enable", {}, format="json")
    assert on.status_code == 200, on.content
    assert (on.json()["enabled"], on.json()["consecutive_failures"]) == (True, 0)


def test_delete_removes_the_endpoint_and_keeps_the_events(keys: dict[str, str]) -> None:
    endpoint = endpoint_of("acme")
    client_for(keys["acme"]).post(f"{ENDPOINTS}/{endpoint.pk}/test", {}, format="json")
    response = client_for(keys["acme"]).delete(f"{ENDPOINTS}/{endpoint.pk}")
    assert response.status_code == 204
    assert not AlertEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert AlertDelivery.objects.count() == 0
    assert AlertEvent.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"kind": "pager"}, "kind", "Must be one of webhook, slack, teams, email."),
        ({"event_types": ["budget.melted"]}, "event_types", "unknown: budget.melted"),
        ({"event_types": []}, "event_types", "at least one of"),
        ({"target": "ftp://hooks.example.com"}, "target", "https:// URL"),
        ({"target": "https://u:p@hooks.example.com"}, "target", "credentials"),
        ({"kind": "email", "target": "not an address"}, "target", "email addresses"),
        ({"colour": "red"}, "colour", "Unknown field"),
    ],
)
def test_create_names_the_bad_field_and_what_to_do(
    keys: dict[str, str], body: dict[str, Any], field: str, says: str
) -> None:
    response = create(keys["acme"], **body)
    assert response.status_code == 400, response.content
    problem = error(response)
    assert problem["code"] == "invalid"
    assert list(problem["fields"]) == [field]
    assert says in " ".join(problem["fields"][field])
    assert AlertEndpoint.objects.count() == 0


def test_update_refuses_fields_that_cannot_change_saying_what_to_use(keys: dict[str, str]) -> None:
    endpoint = endpoint_of("acme")
    acme = client_for(keys["acme"])
    for body, says in [
        ({"kind": "slack"}, "create another endpoint"),
        ({"enabled": False}, "POST .../disable"),
        ({"secret": "mine"}, "rotate-secret"),
    ]:
        response = acme.patch(f"{ENDPOINTS}/{endpoint.pk}", body, format="json")
        assert response.status_code == 400
        assert says in error(response)["message"]
    changed = acme.patch(
        f"{ENDPOINTS}/{endpoint.pk}", {"event_types": ["run.closed"]}, format="json"
    )
    assert changed.json()["event_types"] == ["run.closed"]


def test_list_filters_refuse_bad_values_by_name(keys: dict[str, str]) -> None:
    operator = client_for(keys["operator"])
    assert error(operator.get(DELIVERIES, {"state": "lost"}))["field"] == "state"
    assert error(operator.get(DELIVERIES, {"endpoint": "x"}))["field"] == "endpoint"
    assert error(operator.get(EVENTS, {"type": "nope"}))["field"] == "type"
    assert error(operator.get(ENDPOINTS, {"kind": "webhook"}))["field"] == "kind"


def test_a_disabled_endpoints_test_event_waits_for_it(keys: dict[str, str]) -> None:
    endpoint = endpoint_of(None)
    endpoint_disable(endpoint, reason="maintenance")
    response = client_for(keys["operator"]).post(
        f"{ENDPOINTS}/{endpoint.pk}/test", {}, format="json"
    )
    assert response.status_code == 202
    assert AlertDelivery.objects.get().state == "pending"


def test_create_and_rotate_refuse_an_idempotency_key_rather_than_store_the_secret(
    keys: dict[str, str],
) -> None:
    acme = client_for(keys["acme"])
    body = {"kind": "webhook", "target": URL, "event_types": ["run.closed"]}
    made = acme.post(ENDPOINTS, body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert made.status_code == 400
    assert error(made)["field"] == "Idempotency-Key"
    assert AlertEndpoint.objects.count() == 0
    endpoint = endpoint_of("acme")
    rotated = acme.post(
        f"{ENDPOINTS}/{endpoint.pk}/rotate-secret", {}, format="json", HTTP_IDEMPOTENCY_KEY="k2"
    )
    assert rotated.status_code == 400
    assert AlertEndpoint.objects.get().secret == endpoint.secret


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    local = {"ALERTS_ALLOW_HTTP": True, "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"]}
    with (
        override_settings(LLM_BUDGETS={**settings.LLM_BUDGETS, **local}),
        receiver_running() as running,
    ):
        yield running


def test_a_redelivered_delivery_reaches_the_receiver_once_more_with_its_id(
    keys: dict[str, str], receiver: Receiver
) -> None:
    acme = client_for(keys["acme"])
    made = create(keys["acme"], target=receiver.url, event_types=["alert.test"]).json()
    receiver.secrets.append(made["secret"])
    acme.post(f"{ENDPOINTS}/{made['id']}/test", {}, format="json")
    alerts_deliver()
    (stored,) = receiver.wait_for(1)
    (delivered,) = acme.get(DELIVERIES).json()["results"]
    assert (delivered["id"], delivered["state"], delivered["attempts"]) == (
        stored.delivery,
        "delivered",
        1,
    )
    assert delivered["last_status_code"] == 200

    acme.post(f"{DELIVERIES}/{delivered['id']}/redeliver", {}, format="json")
    alerts_deliver()
    alerts_deliver()  # nothing left: the redelivery went out once
    assert receiver.seen == [stored.delivery, stored.delivery]
    again = acme.get(f"{DELIVERIES}/{delivered['id']}").json()
    assert (again["state"], again["attempts"]) == ("delivered", 2)


# --- Email addresses a tenant adds are confirmed first (issue 38) ------------------------------

LINK = re.compile(r"https?://\S+/alerts/confirm/\S+")


def links(outbox: list[Any]) -> dict[str, str]:
    """The confirmation link mailed to each address (the last one, if several)."""
    return {message.to[0]: LINK.search(message.body).group(0) for message in outbox}  # type: ignore[union-attr]


def test_a_tenant_keys_email_endpoint_sends_nothing_until_an_address_follows_its_link(
    keys: dict[str, str],
) -> None:
    acme = client_for(keys["acme"])
    response = create(
        keys["acme"],
        kind="email",
        target="ops@acme.example, victim@elsewhere.example",
        event_types=["run.closed", "threshold.crossed"],
    )
    assert response.status_code == 201, response.content
    made = response.json()
    assert made["unconfirmed_emails"] == ["ops@acme.example", "victim@elsewhere.example"]
    assert (made["enabled"], made["disabled_reason"]) == (False, AWAITING_CONFIRMATION)
    sent = links(mail.outbox)
    assert set(sent) == {"ops@acme.example", "victim@elsewhere.example"}
    assert "Nothing is sent to this address until you confirm" in mail.outbox[0].body
    assert sent["ops@acme.example"].startswith("http://testserver/api/llm-budgets/v1/")
    endpoint = AlertEndpoint.objects.get(pk=made["id"])
    tenant = Tenant.objects.get(external_id="acme")
    # Nothing reaches the addresses meanwhile: no delivery, no warning email, no enabling.
    budgets.close_run(tenant="acme", run="r-1", actor="a", reason="done")
    assert not AlertDelivery.objects.filter(endpoint=endpoint).exists()
    assert warning_recipients(tenant, "threshold.crossed") == []
    enabling = acme.post(f"{ENDPOINTS}/{endpoint.pk}/enable", {}, format="json")
    assert enabling.status_code == 400
    assert "No address of this endpoint has confirmed yet" in error(enabling)["message"]
    # Opening the link (a person, or a mail scanner) confirms nothing; the button does.
    page = Client().get(sent["ops@acme.example"])
    assert page.status_code == 200
    assert b"Nothing is sent to this address until you confirm" in page.content
    assert page["Cache-Control"] == "no-store"
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    confirmed = Client().post(sent["ops@acme.example"])
    assert confirmed.status_code == 200
    assert b"receives Acme's budget alerts from now on" in confirmed.content
    endpoint.refresh_from_db()
    assert endpoint.enabled
    assert list(endpoint.unconfirmed_emails) == ["victim@elsewhere.example"]
    assert AuditEvent.objects.filter(
        action="alert_endpoint.confirm_email", actor="ops@acme.example"
    ).exists()
    assert Client().post(sent["ops@acme.example"]).status_code == 200  # twice: confirmed once
    assert AuditEvent.objects.filter(action="alert_endpoint.confirm_email").count() == 1
    # From now on the confirmed address receives; the other still nothing.
    assert warning_recipients(tenant, "threshold.crossed") == ["ops@acme.example"]
    mail.outbox.clear()
    budgets.close_run(tenant="acme", run="r-2", actor="a", reason="done")
    alerts_deliver()
    (alert,) = mail.outbox
    assert alert.to == ["ops@acme.example"]
    assert "r-2" in alert.subject


def test_a_confirmation_link_is_signed_and_valid_24_hours(keys: dict[str, str]) -> None:
    import time_machine

    start = timezone.now()
    with time_machine.travel(start, tick=False):
        made = create(
            keys["acme"], kind="email", target="ops@acme.example", event_types=["run.closed"]
        ).json()
    link = links(mail.outbox)["ops@acme.example"]
    token = link.rsplit("/", 1)[1]
    endpoint_id, address = confirmation_read_at(token, start)
    assert (endpoint_id, address) == (made["id"], "ops@acme.example")
    forged = [
        link[:-3] + ("aaa" if not link.endswith("aaa") else "bbb"),  # tampered signature
        link.replace(token, signing.dumps({"endpoint": made["id"], "address": "x@y.example"})),
    ]
    for url in forged:
        with time_machine.travel(start, tick=False):
            answer = Client().post(url)
        assert answer.status_code == 400
        assert b"This link is not valid" in answer.content
    with time_machine.travel(start + timedelta(hours=24, seconds=1), tick=False):
        expired = Client().post(link)
    assert expired.status_code == 400
    assert b"This link has expired (links are valid 24 hours)" in expired.content
    endpoint = AlertEndpoint.objects.get(pk=made["id"])
    assert not endpoint.enabled
    # Saving the addresses again sends a new link, but only once the last one has expired:
    # a tenant cannot make the installation mail an address over and over.
    acme = client_for(keys["acme"])
    mail.outbox.clear()
    with time_machine.travel(start + timedelta(hours=23), tick=False):
        acme.patch(f"{ENDPOINTS}/{endpoint.pk}", {"target": "ops@acme.example"}, format="json")
    assert mail.outbox == []
    with time_machine.travel(start + timedelta(hours=25), tick=False):
        acme.patch(f"{ENDPOINTS}/{endpoint.pk}", {"target": "ops@acme.example"}, format="json")
        (again,) = mail.outbox
        assert Client().post(links([again])["ops@acme.example"]).status_code == 200
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.unconfirmed_emails) == (True, {})


def confirmation_read_at(token: str, moment: Any) -> tuple[int, str]:
    import time_machine

    from llm_budgets.alerts.confirmation import confirmation_read

    with time_machine.travel(moment, tick=False):
        return confirmation_read(token)


def test_an_address_a_tenant_adds_later_is_confirmed_first_and_the_others_keep_receiving(
    keys: dict[str, str],
) -> None:
    acme = client_for(keys["acme"])
    made = create(keys["acme"], kind="email", target="ops@acme.example").json()
    Client().post(links(mail.outbox)["ops@acme.example"])
    mail.outbox.clear()
    changed = acme.patch(
        f"{ENDPOINTS}/{made['id']}",
        {"target": "ops@acme.example, new@elsewhere.example"},
        format="json",
    )
    assert changed.json()["unconfirmed_emails"] == ["new@elsewhere.example"]
    assert changed.json()["enabled"] is True  # ops still receives
    assert list(links(mail.outbox)) == ["new@elsewhere.example"]
    replaced = acme.patch(
        f"{ENDPOINTS}/{made['id']}", {"target": "other@elsewhere.example"}, format="json"
    )
    assert replaced.json()["unconfirmed_emails"] == ["other@elsewhere.example"]
    assert (replaced.json()["enabled"], replaced.json()["disabled_reason"]) == (
        False,
        AWAITING_CONFIRMATION,
    )
    # A link for an address that was taken out confirms nothing.
    stale = Client().post(links(mail.outbox)["new@elsewhere.example"])
    assert stale.status_code == 400
    assert b"no longer one these alerts go to" in stale.content


def test_the_operators_and_the_host_vouch_for_the_addresses_they_add(
    keys: dict[str, str],
) -> None:
    made = create(keys["operator"], tenant="acme", kind="email", target="ops@acme.example").json()
    assert (made["enabled"], made["unconfirmed_emails"]) == (True, [])
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.example")
    assert mail.outbox == []
    tenant = Tenant.objects.get(external_id="acme")
    assert warning_recipients(tenant, "threshold.crossed") == [
        "ops@acme.example",
        "billing@acme.example",
    ]


def test_a_link_that_could_not_be_emailed_is_sent_when_the_addresses_are_saved_again(
    keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_budgets.alerts import endpoints

    sending = endpoints.confirmation_send

    def down(**kwargs: Any) -> None:
        raise ConnectionRefusedError("smtp down")

    monkeypatch.setattr(endpoints, "confirmation_send", down)
    made = create(keys["acme"], kind="email", target="ops@acme.example").json()
    assert made["unconfirmed_emails"] == ["ops@acme.example"]
    assert AlertEndpoint.objects.get(pk=made["id"]).unconfirmed_emails == {"ops@acme.example": ""}
    monkeypatch.setattr(endpoints, "confirmation_send", sending)
    client_for(keys["acme"]).patch(
        f"{ENDPOINTS}/{made['id']}", {"target": "ops@acme.example"}, format="json"
    )
    assert list(links(mail.outbox)) == ["ops@acme.example"]  # at once, not 24 h later


def test_consent_is_per_tenant_and_address_one_link_covers_every_endpoint(
    keys: dict[str, str],
) -> None:
    # A tenant cannot mail an address over and over by creating endpoint after endpoint: while a
    # link is valid no other is sent, following it confirms the address on each endpoint of the
    # tenant, and an address that receives the tenant's alerts is not asked again.
    first = create(keys["acme"], kind="email", target="someone@else.example").json()
    second = create(keys["acme"], kind="email", target="someone@else.example").json()
    assert second["unconfirmed_emails"] == ["someone@else.example"]
    (message,) = mail.outbox
    globex = create(keys["globex"], kind="email", target="someone@else.example").json()
    assert len(mail.outbox) == 2  # another tenant asks for itself
    assert Client().post(links([message])["someone@else.example"]).status_code == 200
    for made in (first, second):
        endpoint = AlertEndpoint.objects.get(pk=made["id"])
        assert (endpoint.enabled, endpoint.unconfirmed_emails) == (True, {})
    assert not AlertEndpoint.objects.get(pk=globex["id"]).enabled
    third = create(keys["acme"], kind="email", target="someone@else.example").json()
    assert (third["enabled"], third["unconfirmed_emails"]) == (True, [])
    assert len(mail.outbox) == 2
