"""Shared pieces of the Stripe billing tests: a fake Stripe on 127.0.0.1, settings pointing the
real ``stripe`` client at it, and ledger lines to bill."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum

from llm_budgets import budgets
from llm_budgets.billing.setup import billing_setup
from llm_budgets.models import UsageRecord
from llm_budgets.testing.fakes.stripe_server import StripeServer
from tests.factories import price_fake, seed

API_KEY = "sk_test_llmb"
WEBHOOK_SECRET = "whsec_test_llmb"


def stripe_settings(base_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "STRIPE_API_KEY": API_KEY,
        "STRIPE_API_BASE": base_url,
        "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "STRIPE_RETRY_BASE_SECONDS": 10,
        "LOCK_TIMEOUT_SECONDS": 30,
        **extra,
    }


@pytest.fixture
def fake_stripe(settings: Any) -> Iterator[StripeServer]:
    with StripeServer() as fake:
        settings.LLM_BUDGETS = stripe_settings(fake.base_url)
        yield fake


def set_up(fake: StripeServer, *, tenant: str = "acme", customer: str | None = None) -> str:
    """The seed tenant with a big budget, a meter in the fake, and a linked customer."""
    seed(limit="1000000", tenant=tenant)
    billing_setup(event_name="llm_usage")
    cid = fake.add_customer(customer)
    budgets.link_stripe_customer(tenant=tenant, customer_id=cid)
    return cid


def odd_price() -> None:
    """Before ``set_up``: a price whose charges are not whole millionths (1000 output tokens
    cost 333.3333 millionths), so there are remainders to carry."""
    price_fake(output_per_mtok="0.3333333")


def ledger_units(tenant: str = "acme") -> Decimal:
    """The tenant's billable ledger total in millionths (exact, not rounded)."""
    total = UsageRecord.objects.filter(tenant__external_id=tenant, counter__isnull=True).aggregate(
        total=Sum("customer_cost")
    )["total"]
    return Decimal(total or 0) * 1_000_000


def sign(payload: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    stamp = int(at if at is not None else time.time())
    mac = hmac.new(secret.encode(), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"


def event(kind: str, obj: dict[str, Any], event_id: str = "evt_1") -> bytes:
    return json.dumps(
        {"id": event_id, "object": "event", "type": kind, "data": {"object": obj}}
    ).encode()
