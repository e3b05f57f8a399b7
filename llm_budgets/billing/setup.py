"""The meter and its metered price in Stripe, created or found (idempotently)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from llm_budgets.billing.client import stripe_client
from llm_budgets.conf import conf
from llm_budgets.models import StripeMeter, StripePlanMeter

# Currencies whose smallest unit is the unit itself (Stripe's zero-decimal currencies).
ZERO_DECIMAL = {
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
}  # fmt: skip


def unit_amount_decimal(currency: str) -> str:
    """The price of one meter unit (a millionth of the currency unit) in Stripe's smallest
    currency unit: 0.0001 cents for USD, 0.000001 yen for JPY."""
    minor = 1 if currency.upper() in ZERO_DECIMAL else 100
    return format(Decimal(minor).scaleb(-6).normalize(), "f")


@dataclass(frozen=True)
class SetupResult:
    event_name: str
    meter_id: str
    price_id: str
    created_meter: bool
    created_price: bool


def event_names() -> list[str]:
    names = {conf.STRIPE_METER_EVENT_NAME}
    names.update(StripePlanMeter.objects.values_list("event_name", flat=True))
    return sorted(names)


def billing_setup(
    *, event_name: str, currency: str | None = None, now: datetime | None = None
) -> SetupResult:
    """Find or create the ``sum`` meter of ``event_name`` (customer mapped by id from
    ``stripe_customer_id``, value from ``value``) and a monthly metered price on it in
    ``currency``; remember both. Running it again finds them."""
    client = stripe_client()
    currency = (currency or conf.CURRENCY).lower()
    meter = next(
        (
            m
            for m in client.v1.billing.meters.list(params={"limit": 100}).auto_paging_iter()
            if m.event_name == event_name
        ),
        None,
    )
    created_meter = meter is None
    if meter is None:
        meter = client.v1.billing.meters.create(
            params={
                "display_name": f"LLM usage ({event_name})",
                "event_name": event_name,
                "default_aggregation": {"formula": "sum"},
                "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
                "value_settings": {"event_payload_key": "value"},
            }
        )
    lookup_key = f"llm_budgets_{event_name}_{currency}"[:200]
    prices = client.v1.prices.list(params={"lookup_keys": [lookup_key], "limit": 1}).data
    created_price = not prices
    if prices:
        price = prices[0]
    else:
        price = client.v1.prices.create(
            params={
                "currency": currency,
                "unit_amount_decimal": Decimal(unit_amount_decimal(currency)),
                "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
                "product_data": {"name": f"LLM usage ({event_name})"},
                "lookup_key": lookup_key,
            }
        )
    StripeMeter.objects.update_or_create(
        event_name=event_name,
        defaults={
            "meter_id": meter.id,
            "price_id": price.id,
            "currency": currency.upper(),
            "created_at": now or timezone.now(),
        },
    )
    return SetupResult(event_name, meter.id, price.id, created_meter, created_price)
