"""budgets.quote (issue 3 item 8): the itemised worst case, the version and the budgets, held
nowhere."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llm_budgets import budgets
from llm_budgets.models import AuditEvent, Counter, EndUser, Plan, Reservation

pytestmark = pytest.mark.django_db


def _rows() -> tuple[int, int, int, int]:
    return (
        Reservation.objects.count(),
        Counter.objects.count(),
        EndUser.objects.count(),
        AuditEvent.objects.count(),
    )


def test_quote_itemises_the_worst_case_and_holds_nothing() -> None:
    price = budgets.set_price(
        provider="anthropic",
        model="claude-x",
        input_per_mtok="3",
        output_per_mtok="15",
        cache_write_per_mtok="3.75",
        per_request="0.001",
    )
    Plan.objects.create(name="pro", markup_percent=Decimal(25))
    budgets.ensure_tenant(tenant="acme", plan="pro")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("0.01"), window="day")
    budgets.set_limit(amount=Decimal(1000), window="month", unit="customer_price")
    before = _rows()
    quote = budgets.quote(
        tenant="acme",
        end_user="new-user",
        model="claude-x",
        input_tokens=1_000,
        max_output_tokens=2_000,
    )
    assert _rows() == before  # no hold, no counter, no end user, no audit
    estimate = quote.estimate
    assert quote.provider == "anthropic"
    assert estimate.price is not None
    assert estimate.price.id == price.id
    # Plain data, not the model: the quote's price version is a PriceResult.
    assert estimate.price == price
    assert (estimate.price.cache_write_per_mtok, estimate.price.per_request) == (
        Decimal("3.75"),
        Decimal("0.001"),
    )
    assert [(i.dimension, i.quantity, i.rate) for i in estimate.items] == [
        ("cache_write_per_mtok", 1_000, Decimal("3.75")),
        # What a commit may report beyond the held input (10% + 256), held at the same rate.
        ("input_tolerance", 356, Decimal("3.75")),
        ("output_per_mtok", 2_000, Decimal(15)),
        ("per_request", 1, Decimal("0.001")),
    ]
    assert estimate.amount == Decimal("0.036085")
    assert estimate.customer_amount == Decimal("0.04510625")
    assert estimate.input_tolerance == Decimal("0.001335")
    assert estimate.customer_input_tolerance == Decimal("0.00166875")
    draws = {(d.status.scope_label, d.status.window): d for d in quote.budgets}
    assert draws[("tenant acme", "month")].fits
    assert not draws[("end user acme/*", "day")].fits  # 0.036085 > 0.01
    assert draws[("global", "month")].would_hold == Decimal("0.04510625")
    assert not quote.admissible


def test_quote_explains_a_policy_price() -> None:
    Plan.objects.create(
        name="fixed",
        unknown_model_policy="reserve_fixed",
        unknown_model_fixed_amount=Decimal("0.2"),
        default_max_output_tokens=100,
    )
    budgets.ensure_tenant(tenant="acme", plan="fixed")
    budgets.set_limit(tenant="acme", amount=Decimal(1), window="month")
    quote = budgets.quote(tenant="acme", provider="p", model="mystery", prompt="hello")
    assert (quote.estimate.price, quote.estimate.pricing_basis) == (None, "fixed")
    assert quote.estimate.amount == Decimal("0.2")
    assert quote.estimate.max_output_tokens == 100
    assert quote.admissible
