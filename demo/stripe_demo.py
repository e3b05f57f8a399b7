"""``make demo``'s Stripe part: a tenant's usage delivered, exactly once, to a fake Stripe server
run on 127.0.0.1 (the same fake the tests use), with the real ``stripe`` package.

Nothing here is needed by the app. For a real test-mode account, see :data:`REAL_ACCOUNT`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from django.test import override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.billing.reconciliation import billing_reconcile
from llm_budgets.billing.setup import billing_setup
from llm_budgets.billing.stripe_push import hour_of, stripe_push
from llm_budgets.engine.admission import reservation_create
from llm_budgets.engine.settlement import reservation_commit
from llm_budgets.models import MeterDelivery, MeterDeliveryState, Price
from llm_budgets.money import display

TENANT = "stripe-demo-co"
PROVIDER, MODEL = "demo", "stripe-demo"  # 30,000 per million output tokens: 0.03 a token

REAL_ACCOUNT = """\
To bill a real Stripe test-mode account instead:
  LLM_BUDGETS["STRIPE_API_KEY"] = "sk_test_..."          (env STRIPE_API_KEY in this project)
  LLM_BUDGETS["STRIPE_WEBHOOK_SECRET"] = "whsec_..."     (env STRIPE_WEBHOOK_SECRET)
  python manage.py llm_budgets_stripe_setup              # prints the meter and price ids
  subscribe each customer to the printed price, then
  budgets.link_stripe_customer(tenant="acme", customer_id="cus_...")
  webhook endpoint: https://<host>/api/llm-budgets/v1/stripe/webhook (invoice.paid,
  invoice.payment_failed, customer.deleted); docs/billing.md has the rest."""


@dataclass
class StripeDemoReport:
    customer: str = ""
    meter_id: str = ""
    price_id: str = ""
    ledger_total: Decimal = Decimal(0)
    stripe_units: Decimal = Decimal(0)
    events: int = 0
    duplicates_absorbed: int = 0
    reconciliation: str = ""
    lines: list[str] = field(default_factory=list)


def _fake_server() -> type:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from llm_budgets.testing.fakes.stripe_server import StripeServer

    return StripeServer


def _use(tokens: int, at: datetime) -> Decimal:
    hold = reservation_create(
        tenant=TENANT,
        provider=PROVIDER,
        model=MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        now=at,
    )
    return reservation_commit(hold.pk, input_tokens=0, output_tokens=tokens, now=at).customer_cost


def stripe_demo_run() -> StripeDemoReport:
    report = StripeDemoReport()
    with _fake_server()() as fake:
        settings = {"STRIPE_API_KEY": "sk_test_demo", "STRIPE_API_BASE": fake.base_url}
        with override_settings(LLM_BUDGETS=settings):
            customer = fake.add_customer(name="Stripe Demo Co")
            if not Price.objects.filter(provider=PROVIDER, model=MODEL).exists():
                budgets.set_price(
                    provider=PROVIDER,
                    model=MODEL,
                    input_per_mtok=Decimal(0),
                    output_per_mtok=Decimal(30000),
                    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                )
            budgets.ensure_tenant(tenant=TENANT, name="Stripe Demo Co")
            budgets.set_limit(tenant=TENANT, amount=Decimal(1000), window="month")
            setup = billing_setup(event_name="llm_usage")
            report.meter_id, report.price_id = setup.meter_id, setup.price_id
            budgets.link_stripe_customer(tenant=TENANT, customer_id=customer, actor="demo")
            now = timezone.now()
            started = now
            # Usage in two closed hours (closed hours are delivered), ending an hour before this
            # one: reconciliation compares up to the hour before the current one (Stripe's
            # summaries lag), so the run below is dated now, not an hour ahead.
            hour = hour_of(now) - timedelta(hours=3)
            for minute, tokens in ((5, 1000), (20, 333), (45, 77)):
                report.ledger_total += _use(tokens, hour + timedelta(minutes=minute))
            report.ledger_total += _use(500, hour + timedelta(hours=1, minutes=10))
            # Stripe records the first event, then the connection drops before its answer.
            fake.inject("/v1/billing/meter_events", "drop_after")
            first = stripe_push(now=now)
            report.lines.append(f"first push: {first} (Stripe's answer to one event was lost)")
            again = stripe_push(now=now + timedelta(minutes=1))
            report.lines.append(f"retry push: {again} (same identifier: Stripe holds it once)")
            report.duplicates_absorbed = fake.state.requests.count(
                ("POST", "/v1/billing/meter_events")
            ) - len(fake.state.events)
            sent = MeterDelivery.objects.filter(
                tenant__external_id=TENANT,
                state=MeterDeliveryState.SENT,
                created_at__gte=started,
            )
            report.events = len(fake.live_events(customer))
            report.stripe_units = fake.total(customer)
            assert report.events == sent.count()
            run = billing_reconcile(now=now, days=1, customer_ids=[customer])
            report.customer = customer
            report.reconciliation = (
                "clean" if run.is_clean else f"{run.differences} difference(s) {run.error}"
            )
    return report


def stripe_demo_render(report: StripeDemoReport) -> str:
    ledger_units = (report.ledger_total * 1_000_000).normalize()
    out = [
        "",
        "Stripe metered billing (a fake Stripe on 127.0.0.1, the real stripe package)",
        f"  meter {report.meter_id}, metered price {report.price_id} (0.0001 cents a unit)",
        f"  tenant {TENANT} linked to {report.customer}; "
        "4 calls in two closed hours before the last one",
        *(f"  {line}" for line in report.lines),
        f"  ledger at customer price: {display(report.ledger_total)} USD = {ledger_units:f} "
        "millionths",
        f"  Stripe holds {report.events} meter event(s) totalling {report.stripe_units} "
        f"millionths ({report.duplicates_absorbed} resend(s) absorbed)",
        f"  difference: {abs(report.stripe_units - ledger_units):f} unit(s); "
        f"reconciliation: {report.reconciliation}",
        "",
        REAL_ACCOUNT,
    ]
    return "\n".join(out)
