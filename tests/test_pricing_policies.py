"""Price versions in use, unknown-model policies, output ceilings and customer price
(issue 3 items 1, 5, 6, 7 and 10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError
from django.test import override_settings

from llm_budgets import budgets
from llm_budgets.engine.admission import reservation_create
from llm_budgets.engine.settlement import (
    reservation_commit,
    reservation_release,
    reservations_sweep,
)
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    OutputCeilingRequired,
    UnknownPrice,
    UsageExceedsHold,
)
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    AuditEvent,
    Counter,
    Plan,
    PricingBasis,
    Reservation,
    UnknownModelPolicy,
    UsageRecord,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _tenant(plan: Plan | None = None, *, limit: str = "1000", **budget: object) -> None:
    budgets.ensure_tenant(tenant="acme", plan=plan.name if plan else None)
    budgets.set_limit(tenant="acme", amount=Decimal(limit), window="lifetime", **budget)  # type: ignore[arg-type]


def _price(model: str = "m", *, output: str = "10", at: datetime = T0, **fields: object) -> None:
    budgets.set_price(
        provider="p",
        model=model,
        input_per_mtok="1",
        output_per_mtok=output,
        effective_from=at,
        **fields,
    )


def _reserve(model: str = "m", *, at: datetime, **kwargs: object) -> Reservation:
    """A million input tokens and a million output tokens: 1 + 10 at ``_price``'s default, and
    the input tolerance (100,256 tokens: 0.100256) besides."""
    values: dict[str, object] = {"input_tokens": 1_000_000, "max_output_tokens": 1_000_000}
    values.update(kwargs)
    return reservation_create(tenant="acme", provider="p", model=model, now=at, **values)


# --- versions --------------------------------------------------------------------------------


def test_a_reservation_made_before_a_price_change_settles_at_the_old_price() -> None:
    _price(output="10")
    _tenant()
    before = _reserve(at=T0 + timedelta(hours=1))
    _price(output="20", at=T0 + timedelta(hours=2))  # a new version, from T0+2h
    after = _reserve(at=T0 + timedelta(hours=3))
    assert (before.amount, after.amount) == (Decimal("11.100256"), Decimal("21.100256"))
    settled_late = reservation_commit(
        before.pk, input_tokens=1_000_000, output_tokens=1_000_000, now=T0 + timedelta(hours=4)
    )
    settled_new = reservation_commit(
        after.pk, input_tokens=1_000_000, output_tokens=1_000_000, now=T0 + timedelta(hours=4)
    )
    assert (settled_late.cost, settled_new.cost) == (Decimal(11), Decimal(21))
    lines = {line.reservation_id: line.price for line in UsageRecord.objects.all()}
    assert lines[before.pk] == before.price != lines[after.pk]


def test_a_version_is_never_edited_by_set_price() -> None:
    _price()
    with pytest.raises(InvalidUsage, match="versions are never edited") as info:
        _price(output="99")
    assert info.value.field == "effective_from"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tiers": [{"above_input_tokens": 10, "prices": {"nope": "1"}}]}, "tiers.prices"),
        ({"daily_spans": [{"start": "25:00", "end": "01:00", "prices": {}}]}, "daily_spans"),
        ({"tool_fees": {"web_search": 0.01}}, "tool_fees.web_search"),
        ({"cached_input_per_mtok": "0.1234567890123456789"}, "cached_input_per_mtok"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_bad_price_fields_are_refused_naming_the_field(
    fields: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidUsage) as info:
        _price(**fields)
    assert info.value.field == field


# --- unknown models --------------------------------------------------------------------------


def test_refuse_is_the_default_and_explains_how_to_price_the_model() -> None:
    _tenant(Plan.objects.create(name="basic"))
    with pytest.raises(UnknownPrice, match=r"p/unknown.*set_price.*llm_budgets_sync_prices"):
        _reserve("unknown", at=T0)
    assert not Reservation.objects.exists()


def test_reserve_fixed_holds_and_settles_a_fixed_amount_marked_as_policy() -> None:
    plan = Plan.objects.create(
        name="fixed",
        unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED,
        unknown_model_fixed_amount=Decimal("0.5"),
    )
    _tenant(plan)
    held = _reserve("unknown", at=T0)
    assert (held.amount, held.price, held.pricing_basis) == (Decimal("0.5"), None, "fixed")
    result = reservation_commit(held.pk, input_tokens=10, output_tokens=10, now=T0)
    assert (result.cost, result.pricing_basis) == (Decimal("0.5"), PricingBasis.FIXED)
    line = UsageRecord.objects.get()
    assert (line.pricing_basis, line.price) == (PricingBasis.FIXED, None)
    assert counters_drift() == []


def test_reserve_fixed_settles_at_a_price_that_appears_meanwhile() -> None:
    plan = Plan.objects.create(
        name="fixed",
        unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED,
        unknown_model_fixed_amount=Decimal("0.5"),
    )
    _tenant(plan)
    held = _reserve("new-model", at=T0)
    _price("new-model", at=T0 + timedelta(seconds=30))
    result = reservation_commit(
        held.pk, input_tokens=1000, output_tokens=1000, now=T0 + timedelta(seconds=60)
    )
    assert (result.cost, result.pricing_basis) == (Decimal("0.011"), PricingBasis.PRICE)
    assert UsageRecord.objects.get().price is not None


def test_a_fixed_hold_at_a_tier_the_new_price_lacks_settles_at_its_fixed_amount() -> None:
    """Review finding: a fixed hold asked at a service tier could never commit once a price
    without that tier appeared (UnknownPrice on every try), and ended only by expiry."""
    plan = Plan.objects.create(
        name="fixed",
        unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED,
        unknown_model_fixed_amount=Decimal("0.5"),
    )
    _tenant(plan)
    held = _reserve("new-model", at=T0, service_tier="priority")
    _price("new-model", at=T0 + timedelta(seconds=30))
    result = reservation_commit(
        held.pk, input_tokens=1000, output_tokens=1000, now=T0 + timedelta(seconds=60)
    )
    assert (result.cost, result.pricing_basis) == (Decimal("0.5"), PricingBasis.FIXED)
    assert counters_drift() == []


def test_a_fixed_policy_needs_a_positive_amount_never_zero() -> None:
    with pytest.raises(IntegrityError):
        Plan.objects.create(
            name="free",
            unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED,
            unknown_model_fixed_amount=Decimal(0),
        )


def test_price_as_uses_the_other_models_price_and_marks_the_ledger() -> None:
    _price("reference", output="10")
    plan = Plan.objects.create(
        name="alias",
        unknown_model_policy=UnknownModelPolicy.PRICE_AS,
        unknown_model_price_as_provider="p",
        unknown_model_price_as_model="reference",
    )
    _tenant(plan)
    held = _reserve("unknown", at=T0 + timedelta(hours=1))
    assert (held.amount, held.pricing_basis, held.model) == (
        Decimal("11.100256"),
        "price_as",
        "unknown",
    )
    reservation_commit(held.pk, input_tokens=0, output_tokens=100_000, now=T0 + timedelta(hours=1))
    line = UsageRecord.objects.get()
    assert (line.cost, line.pricing_basis, line.model) == (Decimal(1), "price_as", "unknown")


def test_price_as_a_model_without_price_refuses() -> None:
    plan = Plan.objects.create(
        name="alias",
        unknown_model_policy=UnknownModelPolicy.PRICE_AS,
        unknown_model_price_as_provider="p",
        unknown_model_price_as_model="missing",
    )
    _tenant(plan)
    with pytest.raises(UnknownPrice, match="price_as p/missing, which has no price either"):
        _reserve("unknown", at=T0)


# --- output ceiling --------------------------------------------------------------------------


def test_the_ceiling_is_clamped_to_the_models_known_maximum() -> None:
    _price(max_output_tokens=8_000)
    _tenant(Plan.objects.create(name="defaults", default_max_output_tokens=50_000))
    asked = _reserve(at=T0, max_output_tokens=100_000)
    defaulted = _reserve(at=T0, max_output_tokens=None)
    assert asked.max_output_tokens == defaulted.max_output_tokens == 8_000
    assert asked.amount == Decimal("1.180256")


def test_the_context_window_bounds_the_ceiling_when_no_maximum_is_known() -> None:
    _price(context_window=16_000)
    _tenant()
    assert _reserve(at=T0, max_output_tokens=100_000).max_output_tokens == 16_000


def test_without_a_ceiling_or_plan_default_the_request_is_refused() -> None:
    _price(max_output_tokens=8_000)
    _tenant(Plan.objects.create(name="no-default"))
    with pytest.raises(OutputCeilingRequired):
        _reserve(at=T0, max_output_tokens=None)


# --- customer price --------------------------------------------------------------------------


def test_budgets_in_customer_price_hold_and_spend_the_marked_up_amount() -> None:
    _price()
    _tenant(Plan.objects.create(name="markup", markup_percent=Decimal(20)))
    budgets.set_limit(tenant="acme", amount=Decimal(1000), window="month", unit="customer_price")
    held = _reserve(at=T0)  # 11.100256 at provider cost
    assert (held.amount, held.customer_amount, held.markup_percent) == (
        Decimal("11.100256"),
        Decimal("13.3203072"),
        Decimal(20),
    )
    reserved = {c.budget.unit: c.reserved for c in Counter.objects.select_related("budget")}
    assert reserved == {
        "provider_cost": Decimal("11.100256"),
        "customer_price": Decimal("13.3203072"),
    }
    assert counters_drift() == []
    result = reservation_commit(held.pk, input_tokens=1_000_000, output_tokens=0, now=T0)
    assert (result.cost, result.customer_cost) == (Decimal(1), Decimal("1.2"))
    spent = {c.budget.unit: (c.spent, c.reserved) for c in Counter.objects.select_related("budget")}
    assert spent == {
        "provider_cost": (Decimal(1), Decimal(0)),
        "customer_price": (Decimal("1.2"), Decimal(0)),
    }
    assert counters_drift() == []


def test_a_tenant_markup_overrides_the_plan() -> None:
    _price()
    _tenant(Plan.objects.create(name="markup", markup_percent=Decimal(20)))
    budgets.ensure_tenant(tenant="acme", markup_percent="50")
    assert _reserve(at=T0).customer_amount == Decimal("16.650384")
    assert AuditEvent.objects.filter(
        action="tenant.update", after={"markup_percent": "50"}
    ).exists()
    with pytest.raises(InvalidUsage) as info:
        budgets.ensure_tenant(tenant="acme", markup_percent=0.5)
    assert info.value.field == "markup_percent"


def test_a_customer_price_budget_refuses_on_the_marked_up_amount() -> None:
    _price()
    _tenant(Plan.objects.create(name="markup", markup_percent=Decimal(100)), limit="1000")
    budgets.set_limit(tenant="acme", amount=Decimal(20), window="day", unit="customer_price")
    with pytest.raises(BudgetExceeded) as info:
        _reserve(at=T0)  # 11.1 provider cost fits 1000, but 22.2 customer price exceeds 20
    assert info.value.requested == Decimal("22.200512")
    assert info.value.input_tolerance == Decimal("0.200512")  # in the budget's unit


def test_expiry_release_and_late_commit_keep_both_units_conserved() -> None:
    _price()
    _tenant(Plan.objects.create(name="markup", markup_percent=Decimal(10)))
    budgets.set_limit(tenant="acme", amount=Decimal(1000), window="month", unit="customer_price")
    expiring = _reserve(at=T0, ttl=60)
    released = _reserve(at=T0, ttl=60)
    reservation_release(released.pk, now=T0)
    assert reservations_sweep(now=T0 + timedelta(minutes=5)) == 1
    assert counters_drift() == []
    reservation_commit(
        expiring.pk, input_tokens=0, output_tokens=100_000, now=T0 + timedelta(minutes=6)
    )
    assert counters_drift() == []
    spent = {c.budget.unit: c.spent for c in Counter.objects.select_related("budget")}
    assert spent == {"provider_cost": Decimal(1), "customer_price": Decimal("1.1")}


def test_the_unit_of_a_budget_cannot_change() -> None:
    _tenant()
    with pytest.raises(InvalidUsage) as info:
        budgets.set_limit(
            tenant="acme", amount=Decimal(5), window="lifetime", unit="customer_price"
        )
    assert info.value.field == "unit"


def test_the_hold_covers_the_tool_calls_the_request_may_make() -> None:
    _price(tool_fees={"web_search": "0.01"}, per_request="0.001")
    _tenant()
    held = _reserve(at=T0, input_tokens=0, max_output_tokens=1, max_tool_calls={"web_search": 3})
    # 3 searches + request fee + 1e-5 of output + 256 input tokens of tolerance
    assert held.amount == Decimal("0.031266")
    with pytest.raises(InvalidUsage) as info:
        _reserve(at=T0, max_tool_calls={"web_search": -1})
    assert info.value.field == "max_tool_calls['web_search']"
    # A fourth search is more than the hold admits (issue 22 item 2): refused unless recorded.
    with pytest.raises(UsageExceedsHold) as beyond:
        reservation_commit(
            held.pk, input_tokens=0, output_tokens=0, tool_calls={"web_search": 4}, now=T0
        )
    assert (beyond.value.field, beyond.value.allowed) == ("tool_calls['web_search']", 3)
    with override_settings(LLM_BUDGETS={"USAGE_BEYOND_HOLD": "record"}):
        result = reservation_commit(
            held.pk, input_tokens=0, output_tokens=0, tool_calls={"web_search": 4}, now=T0
        )
    assert (result.cost, result.overage) == (Decimal("0.041"), Decimal("0.009734"))
