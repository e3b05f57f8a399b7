"""``make demo``'s alerts part: a budget crosses its 80% warning threshold and the signed webhook
for it reaches a receiver on 127.0.0.1, which verifies it as docs/alerts.md tells a receiver to.

Each run spends under a run budget of its own on one fixed tenant (``demo-alerts``), so a
threshold is crossed anew every run and no tenant is left behind. Nothing here is needed by the
app.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.conf import settings
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.alerts import verify
from llm_budgets.alerts.delivery import alerts_deliver
from llm_budgets.alerts.endpoints import endpoint_create, endpoint_secret_rotate, endpoint_update
from llm_budgets.alerts.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER
from llm_budgets.jobs.thresholds import thresholds_scan
from llm_budgets.models import AlertEndpoint, EndpointKind, Price, Tenant
from llm_budgets.testing.fakes.server import serve_in_background

TENANT = "demo-alerts"
PROVIDER, MODEL = "demo", "alerts-demo"  # 10,000 per million output tokens: 0.01 a token
ACTOR = "make demo"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class AlertsDemoReport:
    run: str = ""
    received: list[Received] = field(default_factory=list)
    thresholds: list[int] = field(default_factory=list)
    verified: bool = False
    verify_error: str = ""


def _receiver() -> tuple[ThreadingHTTPServer, list[Received]]:
    """A webhook receiver on a free port of 127.0.0.1 that keeps what it is sent."""
    got: list[Received] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append(Received(dict(self.headers.items()), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_background(server)
    return server, got


def _endpoint(target: str) -> str:
    """The tenant's demo endpoint pointed at ``target``; returns its signing secret, new this run
    (a secret is shown once: a rerun rotates it rather than reading it back)."""
    endpoint = AlertEndpoint.objects.filter(tenant__external_id=TENANT, kind="webhook").first()
    if endpoint is None:
        _, secret = endpoint_create(
            tenant=Tenant.objects.get(external_id=TENANT),
            kind=EndpointKind.WEBHOOK,
            target=target,
            event_types=["threshold.crossed"],
            description="make demo's receiver",
            actor=ACTOR,
        )
        return secret
    endpoint_update(endpoint, target=target, actor=ACTOR)
    return endpoint_secret_rotate(endpoint, actor=ACTOR)


def alerts_demo_run() -> AlertsDemoReport:
    # A run of its own each time (two runs in one second included): a fresh budget to cross.
    report = AlertsDemoReport(run=f"demo-alerts-{int(time.time())}-{uuid.uuid4().hex[:6]}")
    budgets.ensure_tenant(tenant=TENANT)
    if not Price.objects.filter(provider=PROVIDER, model=MODEL).exists():
        budgets.set_price(
            provider=PROVIDER,
            model=MODEL,
            input_per_mtok=Decimal(0),
            output_per_mtok=Decimal(10_000),
        )
    # A run budget of 1.00 with the default thresholds (50, 80, 100%): 0.85 crosses 80%.
    budgets.set_limit(tenant=TENANT, run=report.run, amount="1.00", window="month", actor=ACTOR)
    server, got = _receiver()
    # The receiver is on loopback over plain http: allowed for the demo explicitly (production
    # refuses both: docs/alerts.md, "Delivery").
    allowed = {
        **settings.LLM_BUDGETS,
        "ALERTS_ALLOW_HTTP": True,
        "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"],
    }
    try:
        with override_settings(LLM_BUDGETS=allowed):
            secret = _endpoint(f"http://127.0.0.1:{server.server_address[1]}/budget-alerts")
            with budgets.reserve(
                tenant=TENANT,
                run=report.run,
                provider=PROVIDER,
                model=MODEL,
                input_tokens=0,
                max_output_tokens=90,
            ) as hold:
                hold.commit(input_tokens=0, output_tokens=85)
            thresholds_scan()
            alerts_deliver()
    finally:
        server.shutdown()
    # The scan records every threshold the spend passed (50% and 80% here), each an event; the
    # receiver got both, and the demo shows the 80% one.
    report.received = [r for r in got if report.run in r.body.decode()]
    report.thresholds = sorted(json.loads(r.body)["data"]["threshold"] for r in report.received)
    try:
        for received in report.received:
            verify(received.body, received.headers.get(SIGNATURE_HEADER), secret)
        report.verified = bool(report.received)
    except ValueError as exc:
        report.verify_error = str(exc)
    return report


def alerts_demo_render(report: AlertsDemoReport) -> str:
    lines = [
        "",
        "== Alerts: a signed webhook for a budget's warning threshold ==",
        f"Run {report.run} spent 0.85 of its 1.00 budget; the threshold job recorded its "
        f"crossings ({', '.join(f'{t}%' for t in report.thresholds) or 'none'}) and the "
        "delivery job sent them to a receiver on 127.0.0.1. The 80% one, as received:",
    ]
    for received in [r for r in report.received if json.loads(r.body)["data"]["threshold"] == 80]:
        lines.append(
            f"  {EVENT_HEADER}: {received.headers.get(EVENT_HEADER)}   "
            f"{DELIVERY_HEADER}: {received.headers.get(DELIVERY_HEADER)}"
        )
        lines.append(f"  {SIGNATURE_HEADER}: {received.headers.get(SIGNATURE_HEADER)}")
        body = json.dumps(json.loads(received.body), indent=2)
        lines += ["  " + line for line in body.splitlines()]
    if not report.received:
        lines.append("  (nothing arrived)")
    lines.append(
        "Signatures verified with llm_budgets.alerts.verify and the endpoint's secret."
        if report.verified
        else f"Signature NOT verified: {report.verify_error or 'nothing to verify'}"
    )
    return "\n".join(lines)
