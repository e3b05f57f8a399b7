"""docs/alerts.md holds (issue 28): one example per event type, each valid against its schema,
and the receiver snippet, run here against real signed deliveries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.alerts import sign
from llm_budgets.alerts.bodies import TYPES, body_check
from llm_budgets.alerts.delivery import alerts_deliver
from llm_budgets.alerts.endpoints import endpoint_create
from llm_budgets.alerts.formats import envelope
from llm_budgets.models import AlertDelivery, AlertDeliveryState, AlertEvent, Tenant
from llm_budgets.testing.fakes.server import serve_in_background
from tests.factories import seed

DOC = (Path(__file__).resolve().parent.parent / "docs" / "alerts.md").read_text()


def examples() -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Each ``### `type` (version n)`` section of "Events" and the JSON examples in it."""
    events = DOC.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for match in re.finditer(
        r"^### `([\w.]+)` \(version (\d+)\)\n(.*?)(?=^### |\Z)", events, re.M | re.S
    ):
        event_type, version, text = match.group(1), int(match.group(2)), match.group(3)
        blocks = re.findall(r"```json\n(.*?)```", text, re.S)
        found.setdefault(event_type, []).extend((version, json.loads(b)) for b in blocks)
    return found


def test_every_event_type_has_one_example_valid_against_its_schema() -> None:
    documented = examples()
    assert sorted(documented) == sorted(TYPES)
    for event_type, items in documented.items():
        assert len(items) == 1, event_type
        ((version, body),) = items
        assert version == TYPES[event_type].version
        body_check(event_type, body)


def test_the_example_check_can_fail() -> None:
    from llm_budgets.alerts.bodies import AlertBodyInvalid

    ((_, body),) = examples()["threshold.crossed"]
    with pytest.raises(AlertBodyInvalid):
        body_check("threshold.crossed", {**body, "spent": 391.25})


def snippet() -> dict[str, Any]:
    code = DOC.split("### Receiver snippet", 1)[1]
    (source,) = re.findall(r"```python\n(.*?)```", code, re.S)[:1]
    namespace: dict[str, Any] = {}
    exec(compile(source, "docs/alerts.md", "exec"), namespace)
    return namespace


def test_the_snippet_refuses_a_wrong_secret_a_tampered_body_and_a_replay() -> None:
    receiver = snippet()
    receiver["SECRET"] = "s3cret"
    body = b'{"data":{},"type":"alert.test"}'
    ok = {"LLM-Budgets-Signature": sign(body, ["s3cret"]), "LLM-Budgets-Delivery": "dlv_1"}
    assert receiver["receive"](body, ok) == 200
    wrong = {**ok, "LLM-Budgets-Signature": sign(body, ["other"])}
    assert receiver["receive"](body, wrong) == 400
    assert receiver["receive"](b'{"type":"changed"}', ok) == 400
    old = {**ok, "LLM-Budgets-Signature": sign(body, ["s3cret"], timestamp=1_000_000_000)}
    assert receiver["receive"](body, old) == 400
    assert receiver["receive"](body, {"LLM-Budgets-Delivery": "dlv_1"}) == 400


@pytest.fixture
def snippet_server() -> Iterator[tuple[str, dict[str, Any], list[int]]]:
    """The snippet behind a real HTTP server on 127.0.0.1; the statuses it answered."""
    receiver = snippet()
    answered: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = receiver["receive"](body, dict(self.headers.items()))
            answered.append(status)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_background(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", receiver, answered
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_the_snippet_accepts_real_deliveries_and_stores_a_redelivery_once(
    snippet_server: tuple[str, dict[str, Any], list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, receiver, answered = snippet_server
    local = {
        **settings.LLM_BUDGETS,
        "ALERTS_ALLOW_HTTP": True,
        "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"],
    }
    with override_settings(LLM_BUDGETS=local):
        seed()
        _, secret = endpoint_create(
            tenant=Tenant.objects.get(external_id="acme"),
            kind="webhook",
            target=url,
            event_types=["kill_switch.tripped"],
        )
        receiver["SECRET"] = secret
        budgets.trip(tenant="acme", reason="runaway", actor="alice")
        alerts_deliver()
        (delivery,) = AlertDelivery.objects.all()
        assert delivery.state == AlertDeliveryState.DELIVERED
        # The answer was lost: the same delivery comes again, and is acknowledged, not stored.
        payload = envelope(AlertEvent.objects.get())
        headers = {
            "LLM-Budgets-Signature": sign(payload, [secret]),
            "LLM-Budgets-Delivery": delivery.uid,
        }
        assert receiver["receive"](payload, headers) == 200
    assert answered == [200]
    assert receiver["seen_deliveries"] == {delivery.uid}
    assert capsys.readouterr().out.count("kill_switch.tripped") == 1
