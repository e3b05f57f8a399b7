"""The prepaid demonstration (issue 30): a tenant tops up through Stripe Checkout in a fake Stripe
on 127.0.0.1 (the real ``stripe`` package), the signed webhooks credit its balance once (each
is delivered twice), and its calls spend the balance down to a refusal that says to top up."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from django.test import override_settings

from demo.stripe_demo import _fake_server
from llm_budgets import budgets
from llm_budgets.billing.credits import account_of, balance_open, balance_state
from llm_budgets.billing.setup import billing_setup
from llm_budgets.billing.topups import top_up_checkout
from llm_budgets.billing.webhooks import webhook_receive, webhook_verify
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import Price, StripeCustomerLink
from llm_budgets.money import display

TENANT = "prepaid-demo-co"
PROVIDER, MODEL = "demo", "stripe-demo"  # 0.03 an output token, as in the Stripe demo
SECRET = "whsec_demo"  # noqa: S105 - the fake's webhooks, signed here
TOP_UP_URL = "http://127.0.0.1:8000/usage/balance/"


@dataclass
class PrepaidDemoReport:
    credited: Decimal = Decimal(0)
    grants: int = 0
    calls: int = 0
    spent: Decimal = Decimal(0)
    refusal: str = ""
    lines: list[str] = field(default_factory=list)


def _deliver(event: dict[str, object]) -> str:
    payload = json.dumps(event).encode()
    stamp = int(time.time())
    mac = hmac.new(SECRET.encode(), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    webhook_verify(payload=payload, signature=f"t={stamp},v1={mac}")
    return webhook_receive(payload=payload).outcome


def prepaid_demo_run() -> PrepaidDemoReport:
    report = PrepaidDemoReport()
    with _fake_server()() as fake:
        settings = {
            "STRIPE_API_KEY": "sk_test_demo",
            "STRIPE_API_BASE": fake.base_url,
            "STRIPE_WEBHOOK_SECRET": SECRET,
        }
        with override_settings(LLM_BUDGETS=settings):
            if not Price.objects.filter(provider=PROVIDER, model=MODEL).exists():
                budgets.set_price(
                    provider=PROVIDER,
                    model=MODEL,
                    input_per_mtok=Decimal(0),
                    output_per_mtok=Decimal(30000),
                    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                )
            budgets.ensure_tenant(tenant=TENANT, name="Prepaid Demo Co")
            billing_setup(event_name="llm_usage")
            customer = fake.add_customer(name="Prepaid Demo Co")
            budgets.link_stripe_customer(tenant=TENANT, customer_id=customer, actor="demo")
            account = balance_open(tenant=TENANT, top_up_url=TOP_UP_URL, actor="demo")
            before = balance_state(account)
            started = top_up_checkout(
                tenant=TENANT,
                amount="100",
                success_url=TOP_UP_URL + "?paid=1",
                cancel_url=TOP_UP_URL,
                actor="demo",
            )
            report.lines.append(f"Checkout session {started.session_id} for 100.00 USD")
            events = fake.pay_checkout(started.session_id)
            for again, event in [(0, e) for e in events] + [(1, e) for e in events]:
                # Stripe may deliver an event more than once: stored once, answered again.
                outcome = _deliver(event)
                label = "redelivered" if again else "webhook"
                report.lines.append(f"{label} {event['type']}: {outcome}")
            state = balance_state(account_of(TENANT))
            report.credited = state.credit - before.credit
            report.grants = len(fake.live_grants(customer))
            while True:
                try:
                    hold = budgets.reserve(
                        tenant=TENANT,
                        provider=PROVIDER,
                        model=MODEL,
                        input_tokens=0,
                        max_output_tokens=1000,
                    )
                except BudgetExceeded as refused:
                    report.refusal = str(refused)
                    break
                hold.commit(input_tokens=0, output_tokens=1000)
                report.calls += 1
            report.spent = balance_state(account_of(TENANT)).spent - before.spent
            # Leave the tenant unlinked: the fake (and its customer) ends with this run.
            StripeCustomerLink.objects.filter(tenant__external_id=TENANT).update(
                unlinked_at=datetime.now(UTC)
            )
    return report


def prepaid_demo_render(report: PrepaidDemoReport) -> str:
    return "\n".join(
        [
            "",
            "Prepaid credits (a fake Stripe on 127.0.0.1, the real stripe package)",
            *(f"  {line}" for line in report.lines),
            f"  credited once: {display(report.credited)} USD, {report.grants} Stripe credit "
            "grant(s) in all",
            f"  {report.calls} call(s) of 30.00 USD spent {display(report.spent)} USD, then:",
            f"  {report.refusal}",
            "",
        ]
    )
