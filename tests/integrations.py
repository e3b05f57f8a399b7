"""Shared set-up of the integration tests: prices in round numbers, a tenant, and readers of the
ledger and the counters after each path."""

from __future__ import annotations

from decimal import Decimal

from llm_budgets import budgets
from llm_budgets.models import Counter, Reservation, UsageRecord
from tests.factories import PRICES_START

GPT = "gpt-4o"
GPT_MINI = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"


def price_providers() -> None:
    """Per million tokens: input 1, cached input 0.5, output 2 (so a token costs a micro-unit)."""
    for provider, model in (("openai", GPT), ("openai", GPT_MINI), ("anthropic", CLAUDE)):
        budgets.set_price(
            provider=provider,
            model=model,
            input_per_mtok=Decimal(1000000) if model != GPT_MINI else Decimal(100000),
            cached_input_per_mtok=Decimal(500000),
            cache_write_per_mtok=Decimal(1250000),
            cache_write_1h_per_mtok=Decimal(2000000),
            output_per_mtok=Decimal(2000000) if model != GPT_MINI else Decimal(200000),
            tool_fees={"web_search": "10"},
            effective_from=PRICES_START,
        )


def seed_tenant(*, limit: str = "100000", tenant: str = "acme") -> None:
    price_providers()
    budgets.ensure_tenant(tenant=tenant, name=tenant.title())
    budgets.set_limit(tenant=tenant, amount=Decimal(limit), window="month")


def only_reservation() -> Reservation:
    reservations = list(Reservation.objects.all())
    assert len(reservations) == 1, reservations
    return reservations[0]


def charge_line(reservation: Reservation) -> UsageRecord:
    return UsageRecord.objects.get(reservation=reservation, kind="charge")


def tenant_counter() -> Counter:
    """acme's counter; none yet (only admitted calls create counters): zero, as status says."""
    found = Counter.objects.filter(budget__tenant__external_id="acme").first()
    return found or Counter(spent=0, reserved=0)


def assert_conserved() -> None:
    """Invariant 2 after the path: spent is the sum of ledger lines, reserved of live holds."""
    counter = tenant_counter()
    spent = sum((line.cost for line in UsageRecord.objects.all()), Decimal(0))
    live = sum(
        (r.amount for r in Reservation.objects.filter(state__in=["held", "uncertain"])),
        Decimal(0),
    )
    assert (counter.spent, counter.reserved) == (spent, live)


def attribute_at(obj: object, path: str) -> object:
    """``obj.a.b`` for ``path`` "a.b" (a guarded client's path)."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj
