"""Alert delivery (issue 28, items 3 and 5): a real receiver on 127.0.0.1, behind the fault
proxy; signatures; the SSRF guard; retries, giving up, disabling; Slack, Teams and email."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.core.checks import run_checks
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.alerts import SignatureInvalid, sign, verify
from llm_budgets.alerts.delivery import alerts_deliver, endpoint_deliver, retry_delay
from llm_budgets.alerts.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_enable,
    endpoint_secret_rotate,
    endpoint_test_send,
    endpoint_update,
)
from llm_budgets.alerts.signing import signature
from llm_budgets.alerts.transport import address_allowed
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import AlertDelivery, AlertDeliveryState, AlertEndpoint, Tenant
from llm_budgets.testing.faultproxy import FaultProxy
from tests.alerts_receiver import Receiver, receiver_running
from tests.factories import seed

pytestmark = pytest.mark.django_db

LOCAL = {
    "ALERTS_ALLOW_HTTP": True,
    "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"],
    "ALERTS_TIMEOUT_SECONDS": 1,
    "ALERTS_RETRY_BASE_SECONDS": 1,
    "ALERTS_RETRY_MAX_SECONDS": 1,
}


def local(**extra: Any) -> override_settings:
    return override_settings(LLM_BUDGETS={**settings.LLM_BUDGETS, **LOCAL, **extra})


@pytest.fixture
def allowed() -> Iterator[None]:
    with local():
        yield


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiver_running() as running:
        yield running


def hook(url: str, *, tenant: str | None = "acme", kind: str = "webhook") -> tuple[Any, str]:
    owner = Tenant.objects.get(external_id=tenant) if tenant else None
    return endpoint_create(tenant=owner, kind=kind, target=url, event_types=["run.closed"])


def close_runs(count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        budgets.close_run(tenant="acme", run=f"run-{n}", actor="alice", reason="done")


def due_now() -> None:
    """Time travel for retries: every pending delivery is due (backoff is tested on its own)."""
    AlertDelivery.objects.filter(state=AlertDeliveryState.PENDING).update(
        next_attempt_at=timezone.now()
    )


def deliveries() -> list[AlertDelivery]:
    return list(AlertDelivery.objects.order_by("pk"))


# --- Signatures --------------------------------------------------------------------------------


def test_verify_accepts_its_secret_and_returns_the_timestamp() -> None:
    header = sign(b'{"a":1}', ["s1"], timestamp=1_000)
    assert verify(b'{"a":1}', header, "s1", now=1_010) == 1_000


@pytest.mark.parametrize(
    ("body", "header_secret", "receiver_secret", "now", "reason"),
    [
        (b'{"a":1}', "s1", "other", 1_000, "no signature matches"),
        (b'{"a":2}', "s1", "s1", 1_000, "no signature matches"),  # the body was changed
        (b'{"a":1}', "s1", "s1", 1_000 + 301, "outside the tolerance"),  # replayed later
        (b'{"a":1}', "s1", "s1", 1_000 - 301, "outside the tolerance"),
    ],
)
def test_verify_refuses_wrong_secret_tampering_and_replay(
    body: bytes, header_secret: str, receiver_secret: str, now: int, reason: str
) -> None:
    header = sign(b'{"a":1}', [header_secret], timestamp=1_000)
    with pytest.raises(SignatureInvalid, match=reason):
        verify(body, header, receiver_secret, now=now)


@pytest.mark.parametrize("secret", ["", [], [""], ["s1", ""]])
def test_verify_refuses_an_empty_secret_whatever_the_header(secret: Any) -> None:
    # Anyone can sign with an empty key: a receiver whose secret setting is unset must accept
    # nothing, and say why (a ValueError, not a bad request).
    header = sign(b"{}", ["s1"], timestamp=1_000)
    forged = "t=1000,v1=" + signature("", 1_000, b"{}")
    for given in (header, forged):
        with pytest.raises(ValueError, match="empty") as refused:
            verify(b"{}", given, secret, now=1_000)
        assert not isinstance(refused.value, SignatureInvalid)


@pytest.mark.parametrize("header", [None, "", "t=abc,v1=00", "v1=00", "t=1000"])
def test_verify_refuses_malformed_headers(header: str | None) -> None:
    with pytest.raises(SignatureInvalid):
        verify(b"{}", header, "s1", now=1_000)


def test_rotation_signs_with_both_secrets_during_the_overlap_only(allowed: None) -> None:
    seed()
    endpoint, old = hook("https://hooks.example.com/x")
    new = endpoint_secret_rotate(endpoint, overlap_seconds=3600)
    assert new != old
    assert old not in (endpoint.secret_hint, str(endpoint))  # shown once, never again
    from llm_budgets.alerts.endpoints import endpoint_secrets

    now = timezone.now()
    header = sign(b"x", endpoint_secrets(endpoint, now), timestamp=int(now.timestamp()))
    assert verify(b"x", header, old, now=now.timestamp())  # receivers not switched yet
    assert verify(b"x", header, new, now=now.timestamp())
    later = now + timedelta(hours=2)
    header = sign(b"x", endpoint_secrets(endpoint, later), timestamp=int(later.timestamp()))
    with pytest.raises(SignatureInvalid):
        verify(b"x", header, old, now=later.timestamp())
    assert verify(b"x", header, new, now=later.timestamp())


def test_deliveries_are_signed_and_carry_their_delivery_id(
    allowed: None, receiver: Receiver
) -> None:
    seed()
    _, secret = hook(receiver.url)
    receiver.secrets = [secret]
    close_runs(2)
    alerts_deliver()
    stored = receiver.wait_for(2)
    assert receiver.refused_signatures == 0
    assert [s.delivery for s in stored] == [d.uid for d in deliveries()]
    assert [s.event["data"]["run"] for s in stored] == ["run-0", "run-1"]
    assert stored[0].event["type"] == "run.closed"
    assert stored[0].headers["LLM-Budgets-Event"] == "run.closed"
    assert {d.state for d in deliveries()} == {AlertDeliveryState.DELIVERED}
    assert {d.last_status_code for d in deliveries()} == {200}


def test_a_wrong_secret_is_refused_by_the_receiver_and_retried(
    allowed: None, receiver: Receiver
) -> None:
    seed()
    hook(receiver.url)
    receiver.secrets = ["not-the-secret"]
    close_runs(1)
    alerts_deliver()
    (delivery,) = deliveries()
    assert receiver.refused_signatures == 1
    assert delivery.state == AlertDeliveryState.PENDING
    assert delivery.last_status_code == 400


# --- Delivery under faults ---------------------------------------------------------------------


@pytest.mark.faults
def test_every_event_reaches_the_receiver_once_in_order_through_every_fault(
    allowed: None, receiver: Receiver
) -> None:
    seed()
    with FaultProxy("127.0.0.1", receiver.port) as proxy:
        hook(f"http://127.0.0.1:{proxy.port}/hooks")
        # Each fault meets one attempt: (name, the fault, whether that attempt succeeds).
        faults: list[tuple[str, Callable[[], object], bool]] = [
            ("refused", proxy.refuse, False),
            ("reset", lambda: proxy.cut_when_client_sends(b"POST", before=True), False),
            ("stalled", proxy.stall, False),
            ("slow", lambda: proxy.latency_set(0.2), True),
            ("500", lambda: receiver.script.append((500, {}, 0)), False),
            ("429", lambda: receiver.script.append((429, {"Retry-After": "7"}, 0)), False),
            ("lost answer", lambda: proxy.cut_when_client_sends(b"POST", before=False), False),
            ("slow receiver", lambda: receiver.script.append((200, {}, 0.5)), True),
        ]
        close_runs(len(faults) + 2)
        endpoint_id = deliveries()[0].endpoint_id
        for name, fault, succeeds in faults:
            fault()
            started = timezone.now()
            result = endpoint_deliver(endpoint_id, limit=1)
            proxy.heal()
            assert (result.delivered, result.retrying) == ((1, 0) if succeeds else (0, 1)), name
            if name == "429":
                waiting = [d for d in deliveries() if d.state == AlertDeliveryState.PENDING]
                assert waiting[0].last_status_code == 429
                assert waiting[0].next_attempt_at >= started + timedelta(seconds=7)
            due_now()
        deadline = time.monotonic() + 60
        while AlertDelivery.objects.filter(state=AlertDeliveryState.PENDING).exists():
            assert time.monotonic() < deadline
            alerts_deliver()
            due_now()
    expected = [d.uid for d in deliveries()]
    stored = receiver.wait_for(len(expected))
    assert [s.delivery for s in stored] == expected  # each once, in the order written
    assert [s.event["data"]["run"] for s in stored] == [f"run-{n}" for n in range(len(faults) + 2)]
    assert len(receiver.seen) > len(set(receiver.seen))  # the lost answer was sent again
    assert {d.state for d in deliveries()} == {AlertDeliveryState.DELIVERED}
    assert sum(d.attempts for d in deliveries()) >= len(expected) + 6  # the failed attempts


def test_a_rolled_back_cause_sends_nothing(allowed: None, receiver: Receiver) -> None:
    seed()
    hook(receiver.url)

    class Undo(Exception):
        pass

    def close_then_fail() -> None:
        with transaction.atomic():
            close_runs(1)
            raise Undo

    with pytest.raises(Undo):
        close_then_fail()
    close_runs(1, start=1)
    alerts_deliver()
    assert [s.event["data"]["run"] for s in receiver.wait_for(1)] == ["run-1"]
    assert receiver.seen == [deliveries()[0].uid]


def test_a_redirect_is_not_followed(allowed: None, receiver: Receiver) -> None:
    seed()
    hook(receiver.url)
    receiver.script.append((302, {"Location": "http://169.254.169.254/latest"}, 0))
    close_runs(1)
    alerts_deliver()
    (delivery,) = deliveries()
    assert delivery.state == AlertDeliveryState.PENDING
    assert "redirect" in delivery.last_error
    assert len(receiver.seen) == 0


def test_only_the_first_bytes_of_an_answer_are_read(receiver: Receiver) -> None:
    with local(ALERTS_MAX_RESPONSE_BYTES=1024):
        seed()
        hook(receiver.url)
        receiver.script.append((200, {"X-Flood": "4096"}, 0))
        close_runs(1)
        alerts_deliver()  # with the whole answer awaited, the attempt would time out
        (delivery,) = deliveries()
        assert delivery.state == AlertDeliveryState.DELIVERED, delivery.last_error


def test_retries_back_off_with_jitter_and_honour_retry_after() -> None:
    with local(ALERTS_RETRY_BASE_SECONDS=10, ALERTS_RETRY_MAX_SECONDS=3600):
        delays = [retry_delay(n) for n in range(1, 12) for _ in range(20)]
        assert min(delays[:20]) >= 5
        assert max(delays[:20]) <= 10
        assert max(delays) <= 3600
        assert len({round(d, 6) for d in delays[:20]}) > 1  # jitter
        assert retry_delay(1, retry_after=120) >= 120


def test_a_delivery_past_the_horizon_is_given_up_and_the_next_goes(
    receiver: Receiver,
) -> None:
    with local(ALERTS_RETRY_HORIZON_SECONDS=60):
        seed()
        hook(receiver.url)
        close_runs(2)
        receiver.script.append((500, {}, 0))
        first = deliveries()[0]
        AlertDelivery.objects.filter(pk=first.pk).update(
            first_attempt_at=timezone.now() - timedelta(seconds=120)
        )
        alerts_deliver()  # the head fails past its horizon: given up, the next one is sent
        states = [d.state for d in deliveries()]
        assert states == [AlertDeliveryState.FAILED, AlertDeliveryState.DELIVERED]
        delivery_redeliver(deliveries()[0], actor="support")
        alerts_deliver()
        assert [s.event["data"]["run"] for s in receiver.wait_for(2)] == ["run-1", "run-0"]


def test_repeated_failures_disable_the_endpoint_and_tell_its_owner(receiver: Receiver) -> None:
    with local(ALERTS_DISABLE_AFTER_FAILURES=3):
        seed()
        budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.example")
        endpoint, _ = hook(receiver.url)
        receiver.script.extend([(500, {}, 0)] * 3)
        close_runs(1)
        for _ in range(3):
            alerts_deliver()
            due_now()
        endpoint.refresh_from_db()
        assert not endpoint.enabled
        assert "3 failed attempts in a row" in endpoint.disabled_reason
        (message,) = mail.outbox
        assert message.to == ["billing@acme.example"]
        assert "disabled" in message.subject
        alerts_deliver()
        assert len(receiver.seen) == 0  # nothing sent to a disabled endpoint
        endpoint_enable(endpoint)
        alerts_deliver()
        assert len(receiver.wait_for(1)) == 1  # what waited goes once enabled


# --- Server-side request forgery and plain HTTP -----------------------------------------------


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("8.8.8.8", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("fd00::1", False),
        ("0.0.0.0", False),
        # IPv6 forms that carry an IPv4 address are judged by it (issue 38).
        ("::ffff:0:127.0.0.1", False),  # IPv4-translated
        ("::127.0.0.1", False),  # IPv4-compatible
        ("::10.0.0.1", False),
        ("::8.8.8.8", True),
        ("64:ff9b::127.0.0.1", False),  # NAT64, well-known prefix
        ("64:ff9b::a9fe:a9fe", False),  # ... to the cloud metadata address
        ("64:ff9b::8.8.8.8", True),
        ("64:ff9b:1::a00:1", False),  # NAT64, local-use prefix: never public
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
        ("2002:a00:1::", False),  # 6to4 of 10.0.0.1
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("2606:4700::1111", True),
        ("::", False),
    ],
)
def test_only_public_addresses_are_called(address: str, ok: bool) -> None:
    assert address_allowed(address) is ok


def test_an_embedded_address_is_allowed_by_the_ipv4_the_settings_name() -> None:
    with local(ALERTS_ALLOWED_ADDRESSES=["127.0.0.1"]):
        assert address_allowed("64:ff9b::127.0.0.1")
        assert address_allowed("::ffff:127.0.0.1")
        assert not address_allowed("64:ff9b::127.0.0.2")
    with local(ALERTS_ALLOWED_ADDRESSES=["::1"]):
        assert address_allowed("::1")


def test_a_loopback_endpoint_is_refused_unless_allowed(receiver: Receiver) -> None:
    with local():
        seed()
        hook(receiver.url)  # allowed when created; no longer when delivered
    with local(ALERTS_ALLOWED_ADDRESSES=[]):
        close_runs(1)
        alerts_deliver()
        (delivery,) = deliveries()
        assert "not allowed" in delivery.last_error
        assert receiver.seen == []
    with local():
        due_now()
        alerts_deliver()
        assert len(receiver.wait_for(1)) == 1


def test_a_refused_delivery_never_says_what_the_host_resolves_to(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    with local(ALERTS_ALLOWED_ADDRESSES=["127.0.0.0/8", "::1"]):
        seed()
        hook(receiver.url.replace("127.0.0.1", "localhost"))  # a name, resolved at delivery
    with local(ALERTS_ALLOWED_ADDRESSES=[]):
        close_runs(1)
        alerts_deliver()
    (delivery,) = deliveries()
    # The tenant reads this: that the target is not allowed, not what its host resolves to.
    assert "localhost: the target is not allowed" in delivery.last_error
    assert "127.0.0.1" not in delivery.last_error
    assert "::1" not in delivery.last_error
    assert receiver.seen == []
    # The operators' log says it.
    assert "localhost refused: it resolves to" in caplog.text


def test_a_disabled_endpoints_reason_never_says_where_it_resolves() -> None:
    with local(ALERTS_ALLOWED_ADDRESSES=["127.0.0.0/8", "::1"]):
        seed()
        endpoint, _ = hook("http://localhost:9/never")  # a name: resolved at delivery
    with local(ALERTS_ALLOWED_ADDRESSES=[], ALERTS_DISABLE_AFTER_FAILURES=1):
        close_runs(1)
        alerts_deliver()
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    assert "not allowed" in endpoint.disabled_reason
    assert "127.0.0.1" not in endpoint.disabled_reason


@pytest.mark.parametrize(
    "url",
    [
        "https://localhost/in",
        "https://127.0.0.1/in",
        "https://[::1]/in",
        "https://[::ffff:127.0.0.1]/in",
        "https://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "https://[2002:a00:1::]/in",
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.1/in",
    ],
)
def test_a_target_that_reaches_a_private_address_is_refused_when_created_or_changed(
    url: str,
) -> None:
    seed()
    with local(ALERTS_ALLOWED_ADDRESSES=[]):
        with pytest.raises(InvalidUsage, match="not allowed") as refused:
            hook(url)
        assert refused.value.field == "target"
        assert "127.0.0.1" not in refused.value.message
        assert not AlertEndpoint.objects.exists()  # nothing half-written
        endpoint, _ = hook("https://hooks.example.com/in")  # does not resolve here: accepted
        with pytest.raises(InvalidUsage, match="not allowed"):
            endpoint_update(endpoint, target=url)
        endpoint.refresh_from_db()
        assert endpoint.target == "https://hooks.example.com/in"
    with local(ALERTS_ALLOWED_ADDRESSES=["127.0.0.0/8", "::1", "10.0.0.0/8", "169.254.0.0/16"]):
        hook(url)  # what the operators allow


def test_plain_http_is_refused_at_creation_and_checked_in_production() -> None:
    seed()
    with pytest.raises(InvalidUsage, match="https"):
        hook("http://hooks.example.com/x")
    with pytest.raises(InvalidUsage, match="credentials"):
        hook("https://user:pw@hooks.example.com/x")
    with local(), override_settings(DEBUG=False):
        ids = {m.id for m in run_checks(databases=[])}
        assert "llm_budgets.E110" in ids
        assert "llm_budgets.W111" in ids
    assert not {"llm_budgets.E110", "llm_budgets.W111"} & {m.id for m in run_checks(databases=[])}


# --- Slack, Teams, email -----------------------------------------------------------------------


def test_slack_and_teams_messages_read_money_and_tenant_time(
    allowed: None, receiver: Receiver
) -> None:
    seed(limit="50")
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Paris")
    owner = Tenant.objects.get(external_id="acme")
    for kind in ("slack", "teams"):
        endpoint_create(
            tenant=owner, kind=kind, target=receiver.url, event_types=["budget.exhausted"]
        )
    from llm_budgets.exceptions import BudgetExceeded
    from tests.factories import reserve_30

    reserve_30()
    with pytest.raises(BudgetExceeded):
        reserve_30()
    alerts_deliver()
    slack, teams = sorted(receiver.wait_for(2), key=lambda s: "attachments" in s.event)
    assert "20.00 USD left of 50.00 USD" in slack.event["text"]
    assert "CET" in slack.event["text"] or "CEST" in slack.event["text"]
    card = teams.event["attachments"][0]["content"]
    texts = [block["text"] for block in card["body"]]
    assert any("30.00 USD" in t for t in texts)
    assert card["type"] == "AdaptiveCard"


def test_email_endpoints_send_a_message_with_a_stable_id(allowed: None) -> None:
    seed()
    endpoint, secret = hook("ops@acme.example, cfo@acme.example", kind="email")
    assert secret == ""
    close_runs(1)
    event = endpoint_test_send(endpoint, actor="alice")
    alerts_deliver()
    first, second = mail.outbox
    assert first.to == ["ops@acme.example", "cfo@acme.example"]
    assert "Run run-0 of acme closed" in first.subject
    assert "Test event" in second.subject
    assert first.extra_headers["Message-ID"].startswith("<dlv_")
    assert AlertDelivery.objects.get(event=event).state == AlertDeliveryState.DELIVERED


def test_a_tenant_never_reaches_another_tenants_endpoint(allowed: None) -> None:
    from llm_budgets.alerts.endpoints import EndpointNotFound, endpoint_get

    seed()
    seed(tenant="globex")
    endpoint, _ = hook("https://hooks.example.com/x")
    globex = Tenant.objects.get(external_id="globex")
    with pytest.raises(EndpointNotFound):
        endpoint_get(endpoint.pk, tenant=globex)
    assert endpoint_get(endpoint.pk, tenant=None) == endpoint
    assert AlertEndpoint.objects.count() == 1
    assert json.loads(json.dumps(endpoint.event_types)) == ["run.closed"]
