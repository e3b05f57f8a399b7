"""Shared pieces of the prepaid tests: a prepaid tenant linked to the fake Stripe, signed webhook
deliveries, a paid Checkout."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.test import Client

from llm_budgets import budgets
from llm_budgets.billing.credits import balance_open
from llm_budgets.billing.topups import top_up_checkout
from llm_budgets.models import TopUp
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.stripe_support import set_up, sign

URL = "/api/llm-budgets/v1/stripe/webhook"
TOP_UP_URL = "https://host.example/billing/top-up"


def deliver(event: dict[str, Any]) -> int:
    """Post ``event`` to the webhook, signed; the answer's status."""
    payload = json.dumps(event).encode()
    return (
        Client()
        .post(URL, payload, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(payload))
        .status_code
    )


def prepaid(fake: StripeServer) -> str:
    """acme, linked to a fake customer, its spending prepaid (balance 0, no other limit)."""
    customer = set_up(fake)
    budgets.set_limit(tenant="acme", amount=Decimal("1000000"), window="month")
    balance_open(tenant="acme", top_up_url=TOP_UP_URL, actor="test")
    return customer


def pay(fake: StripeServer, amount: str = "100") -> tuple[TopUp, list[dict[str, Any]]]:
    """A Checkout top-up of ``amount``, paid: the top-up and the events Stripe sends."""
    started = top_up_checkout(
        tenant="acme",
        amount=amount,
        success_url="https://host.example/ok",
        cancel_url="https://host.example/cancel",
    )
    return started.top_up, fake.pay_checkout(started.session_id)
