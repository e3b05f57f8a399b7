"""Admission rules (issue 2, D1 and D8-D12), on whichever database DATABASE_URL selects."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.engine.admission import NoApplicableBudget, reservation_create
from llm_budgets.exceptions import (
    BudgetExceeded,
    IdempotencyKeyReused,
    InvalidUsage,
    OutputCeilingRequired,
    UnknownPrice,
    UnknownTenant,
)
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    AuditEvent,
    Counter,
    EndUser,
    Plan,
    Reservation,
    ReservationState,
    Run,
    Scope,
    UsageRecord,
)
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, PRICES_START, price_fake, reserve_30, seed

pytestmark = pytest.mark.django_db


def _ledger_rows() -> tuple[int, int, int, int]:
    return (
        Reservation.objects.count(),
        Counter.objects.count(),
        UsageRecord.objects.count(),
        EndUser.objects.count(),
    )


@pytest.fixture
def acme() -> None:
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("2.50"),
        output_per_mtok=Decimal("10.00"),
    )
    budgets.ensure_tenant(tenant="acme", name="Acme", timezone="Europe/Amsterdam", billing_day=1)
    budgets.set_limit(amount=Decimal("5000"), window="month")
    budgets.set_limit(tenant="acme", amount=Decimal("100"), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("5"), window="day")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("20"), window="month")


def test_worst_case_is_input_times_input_price_plus_ceiling_times_output_price(acme: None) -> None:
    hold = budgets.reserve(
        tenant="acme", end_user="u-1", model="gpt-4o", input_tokens=1200, max_output_tokens=500
    )
    # (1200 + its input tolerance, 120 + 256) x 2.50 / 1e6 + 500 x 10.00 / 1e6 = 0.00394 + 0.005
    assert hold.amount == Decimal("0.00894")
    assert hold.state == ReservationState.HELD


def test_reserve_holds_on_every_applicable_budget(acme: None) -> None:
    hold = budgets.reserve(
        tenant="acme", end_user="u-1", model="gpt-4o", input_tokens=1200, max_output_tokens=500
    )
    held = {
        (c.budget.scope, c.budget.window): c.reserved
        for c in Counter.objects.filter(holds__reservation_id=hold.id).select_related("budget")
    }
    # u-1's own monthly budget, plus the "*" daily default (u-1 has no daily budget of its own).
    assert held == {
        (Scope.GLOBAL, "month"): Decimal("0.00894"),
        (Scope.TENANT, "month"): Decimal("0.00894"),
        (Scope.END_USER, "month"): Decimal("0.00894"),
        (Scope.END_USER_DEFAULT, "day"): Decimal("0.00894"),
    }


def test_an_end_users_own_budget_replaces_the_default_for_its_window(acme: None) -> None:
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="day")
    scopes = {(s.scope, s.window) for s in budgets.status(tenant="acme", end_user="u-1")}
    assert (Scope.END_USER, "day") in scopes
    assert (Scope.END_USER_DEFAULT, "day") not in scopes


def test_refusal_takes_the_hold_on_none_of_the_budgets(acme: None) -> None:
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("0.01"), window="day")
    budgets.reserve(
        tenant="acme", end_user="u-2", model="gpt-4o", input_tokens=0, max_output_tokens=800
    )
    with pytest.raises(BudgetExceeded) as info:
        budgets.reserve(
            tenant="acme", end_user="u-2", model="gpt-4o", input_tokens=0, max_output_tokens=800
        )
    refusal = info.value
    assert refusal.scope == "end user acme/*"
    assert refusal.window == "day"
    assert refusal.limit == Decimal("0.01")
    # Each call holds 0.00864: 800 output tokens, and 256 input tokens of tolerance (issue #38).
    assert refusal.remaining == Decimal("0.00136")
    assert refusal.requested == Decimal("0.00864")
    assert refusal.input_tolerance == Decimal("0.00064")
    assert refusal.resets_at is not None
    assert refusal.resets_at > timezone.now()
    assert refusal.retry_after is not None
    assert refusal.retry_after >= 1
    assert "end user acme/*" in str(refusal)
    assert "0.00136" in str(refusal)
    assert "needs 0.00864, of which 0.00064 is the input tolerance" in str(refusal)
    # Only the first call's hold exists, on every counter; the global and tenant were untouched.
    assert Reservation.objects.count() == 1
    assert {c.reserved for c in Counter.objects.all()} == {Decimal("0.00864")}


def test_the_tightest_budget_is_the_one_reported(acme: None) -> None:
    budgets.set_limit(tenant="acme", amount=Decimal("0.004"), window="month")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("0.001"), window="day")
    with pytest.raises(BudgetExceeded) as info:
        budgets.reserve(
            tenant="acme", end_user="u-9", model="gpt-4o", input_tokens=0, max_output_tokens=800
        )
    assert info.value.scope == "end user acme/*"


def test_a_failed_call_released_in_the_with_block_leaves_nothing_spent() -> None:
    seed()
    for _ in range(4):
        with pytest.raises(ConnectionError), reserve_30():
            raise ConnectionError("provider down")
    counter = Counter.objects.get()
    assert (counter.spent, counter.reserved) == (0, 0)
    assert set(Reservation.objects.values_list("state", flat=True)) == {ReservationState.RELEASED}


def test_a_timeout_in_the_with_block_keeps_the_hold() -> None:
    seed()
    with pytest.raises(TimeoutError), reserve_30() as hold:
        raise TimeoutError
    # No proof the provider stopped: the hold stays counted, as UNCERTAIN (see test_uncertain).
    assert hold.refresh().state == ReservationState.UNCERTAIN
    assert Counter.objects.get().reserved == Decimal(30)


def test_leaving_the_with_block_unsettled_is_an_error() -> None:
    from llm_budgets.exceptions import ReservationStateError

    seed()
    with pytest.raises(ReservationStateError, match=r"hold\.commit"), reserve_30():
        pass


def test_unknown_price_refuses_and_writes_nothing(acme: None) -> None:
    before = _ledger_rows()
    with pytest.raises(UnknownPrice, match=r"gpt-9 \(from any provider\).*never treated as free"):
        budgets.reserve(
            tenant="acme", end_user="new", model="gpt-9", input_tokens=1, max_output_tokens=1
        )
    assert _ledger_rows() == before


def test_a_price_that_starts_later_is_not_in_effect_yet(acme: None) -> None:
    budgets.set_price(
        provider="openai",
        model="gpt-5",
        input_per_mtok=1,
        output_per_mtok=1,
        effective_from=timezone.now() + timedelta(days=1),
    )
    with pytest.raises(UnknownPrice):
        budgets.reserve(tenant="acme", model="gpt-5", input_tokens=1, max_output_tokens=1)


def test_missing_output_ceiling_refuses_unless_the_plan_sets_one(acme: None) -> None:
    before = _ledger_rows()
    with pytest.raises(OutputCeilingRequired, match="max_output_tokens"):
        budgets.reserve(tenant="acme", end_user="new", model="gpt-4o", input_tokens=10)
    assert _ledger_rows() == before

    Plan.objects.create(name="pro", default_max_output_tokens=1000)
    budgets.ensure_tenant(tenant="acme", plan="pro")
    hold = budgets.reserve(tenant="acme", model="gpt-4o", input_tokens=0)
    assert hold.max_output_tokens == 1000
    assert hold.amount == Decimal("0.01064")  # 1000 output tokens and 256 of input tolerance


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("input_tokens", -1, "input_tokens must be zero or more"),
        ("input_tokens", 1.5, "input_tokens must be a whole number"),
        ("input_tokens", "100", "input_tokens must be a whole number"),
        ("input_tokens", True, "input_tokens must be a whole number"),
        ("input_tokens", 10**12, "input_tokens=1000000000000 is more than"),
        ("max_output_tokens", 0, "max_output_tokens must be at least 1"),
        ("max_output_tokens", -5, "max_output_tokens must be at least 1"),
        ("tenant", "", "tenant must be a non-empty string"),
        ("end_user", 7, "end_user must be a non-empty string"),
        ("model", None, "model must be a non-empty string"),
        ("ttl", 0, "ttl must be from 1 to"),
        ("ttl", 10**9, "ttl must be from 1 to"),
        ("ttl", "soon", "ttl must be seconds"),
        ("idempotency_key", "", "idempotency_key must be a non-empty string"),
    ],
)
def test_bad_arguments_name_the_field_and_write_nothing(
    acme: None, field: str, value: object, message: str
) -> None:
    arguments: dict[str, object] = {
        "tenant": "acme",
        "end_user": "new-user",
        "provider": "openai",
        "model": "gpt-4o",
        "input_tokens": 10,
        "max_output_tokens": 10,
        field: value,
    }
    before = _ledger_rows()
    with pytest.raises(InvalidUsage, match=message) as info:
        reservation_create(**arguments)  # type: ignore[arg-type]
    assert info.value.field == field
    assert _ledger_rows() == before


def test_unknown_tenant_is_refused_with_how_to_fix_it(acme: None) -> None:
    with pytest.raises(UnknownTenant, match=r"ensure_tenant\(tenant=\"nobody\""):
        budgets.reserve(tenant="nobody", model="gpt-4o", input_tokens=1, max_output_tokens=1)


def test_a_tenant_without_any_budget_is_refused_not_uncapped() -> None:
    price_fake()
    budgets.ensure_tenant(tenant="free")
    with pytest.raises(NoApplicableBudget, match="uncapped"):
        reserve_30(tenant="free")
    assert Reservation.objects.count() == 0


def test_first_request_of_an_unknown_end_user_creates_it(acme: None) -> None:
    budgets.reserve(
        tenant="acme", end_user="brand-new", model="gpt-4o", input_tokens=1, max_output_tokens=1
    )
    assert EndUser.objects.filter(tenant__external_id="acme", external_id="brand-new").count() == 1


def test_the_same_idempotency_key_returns_the_same_reservation() -> None:
    seed()
    first = reserve_30(idempotency_key="call-1")
    again = reserve_30(idempotency_key="call-1")
    assert again.id == first.id
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == Decimal(30)


def test_idempotency_keys_are_per_tenant() -> None:
    seed()
    seed(tenant="globex")
    assert reserve_30(idempotency_key="k").id != reserve_30(tenant="globex", idempotency_key="k").id


@pytest.mark.parametrize(
    ("first", "retry", "differs"),
    [
        ({}, {"end_user": "u-new"}, "end_user"),  # an end user not seen yet
        ({"end_user": "u-1"}, {"end_user": "u-2"}, "end_user"),
        ({"end_user": "u-1"}, {"end_user": None}, "end_user"),
        ({}, {"model": "another-model"}, "model"),
        ({}, {"input_tokens": 5}, "input_tokens"),
        ({}, {"max_output_tokens": 999}, "max_output_tokens"),
        ({}, {"tags": {"project": "alpha"}}, "tags"),
        ({}, {"run": "run-1"}, "run"),
        ({}, {"provider": "other", "input_tokens": 5}, "provider, input_tokens"),
    ],
)
def test_an_idempotency_key_reused_for_another_request_is_refused(
    first: dict[str, object], retry: dict[str, object], differs: str
) -> None:
    """The key belongs to the first request: a different one with it is refused, naming what
    differs, and holds nothing (it used to get the first reservation back, silently)."""
    seed()
    budgets.ensure_tenant(tenant="acme")
    if first.get("end_user") == "u-1":
        reserve_30(end_user="u-2").release()  # u-2 is known
    held = reserve_30(idempotency_key="call-1", **first)
    call = {**first, **retry}
    model = call.pop("model", FAKE_MODEL)
    input_tokens = call.pop("input_tokens", 0)
    with pytest.raises(IdempotencyKeyReused) as refused:
        budgets.reserve(
            tenant="acme",
            model=model,
            input_tokens=input_tokens,
            max_output_tokens=call.pop("max_output_tokens", 1000),
            provider=call.pop("provider", FAKE_PROVIDER),
            idempotency_key="call-1",
            **call,  # type: ignore[arg-type]
        )
    assert refused.value.differs == differs
    assert refused.value.reservation_id == str(held.id)
    assert "'call-1' was already used" in str(refused.value)
    assert f"({differs} differ)" in str(refused.value)
    assert Reservation.objects.filter(state="held").count() == 1
    assert not EndUser.objects.filter(external_id="u-new").exists()
    assert not Run.objects.exists()  # a run's first sight creates it only for a call admitted
    assert counters_drift() == []


def test_a_retry_that_asks_the_same_gets_the_reservation() -> None:
    """What is not part of the request is not compared: a provider left out the second time,
    the TTL."""
    seed()
    held = reserve_30(end_user="u-1", tags={"project": "alpha"}, idempotency_key="call-2")
    again = reserve_30(
        end_user="u-1", tags={"project": "alpha"}, idempotency_key="call-2", provider=None, ttl=60
    )
    assert again.id == held.id
    assert Reservation.objects.count() == 1


def test_the_price_version_is_stamped_and_a_new_price_changes_no_record() -> None:
    seed()
    hold = reserve_30()
    old_price = hold.reservation.price
    price_fake(output_per_mtok="60000", effective_from=timezone.now())  # doubles it from now on
    result = hold.commit(input_tokens=0, output_tokens=1000)
    assert result.cost == Decimal(30)  # settled at the version in effect when reserved
    line = UsageRecord.objects.get()
    assert line.price_id == old_price.pk
    assert reserve_30(max_output_tokens=500).amount == Decimal(30)  # new version: 500 x 0.06
    old_price.refresh_from_db()
    assert old_price.output_per_mtok == Decimal(30000)


def test_ttl_sets_expiry() -> None:
    seed()
    hold = reserve_30(ttl=30)
    assert hold.expires_at - hold.reservation.created_at == timedelta(seconds=30)
    default = reserve_30()
    assert default.expires_at - default.reservation.created_at == timedelta(seconds=120)


def test_limit_changes_are_audited() -> None:
    seed()
    budgets.set_limit(
        tenant="acme", amount=Decimal("250"), window="month", actor="ops", reason="upsell"
    )
    event = AuditEvent.objects.filter(action="budget.change_limit").get()
    assert (event.before, event.after, event.actor, event.reason) == (
        {"limit": "100.0000000000"},
        {"limit": "250"},
        "ops",
        "upsell",
    )
    # Setting the same limit again changes nothing and audits nothing.
    budgets.set_limit(tenant="acme", amount=Decimal("250"), window="month")
    assert AuditEvent.objects.filter(action="budget.change_limit").count() == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"amount": 1.5, "window": "month"}, "amount"),
        ({"amount": Decimal("-1"), "window": "month"}, "amount"),
        ({"amount": Decimal("NaN"), "window": "month"}, "amount"),
        ({"amount": "ten", "window": "month"}, "amount"),
        ({"amount": 10, "window": "fortnight"}, "window"),
        ({"amount": 10, "window": "month", "end_user": "u-1"}, "tenant"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidUsage) as info:
        budgets.set_limit(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_prices_refuse_floats() -> None:
    with pytest.raises(InvalidUsage, match=r"Decimal\(\"2.5\"\)") as info:
        budgets.set_price(provider="openai", model="x", input_per_mtok=2.5, output_per_mtok=1)  # type: ignore[arg-type]
    assert info.value.field == "input_per_mtok"


def test_the_provider_can_be_left_out_only_when_one_provider_prices_the_model() -> None:
    seed()
    assert reserve_30(provider=None).reservation.provider == FAKE_PROVIDER
    budgets.set_price(provider="other", model=FAKE_MODEL, input_per_mtok=1, output_per_mtok=1)
    with pytest.raises(InvalidUsage, match="several providers") as info:
        budgets.reserve(tenant="acme", model=FAKE_MODEL, input_tokens=0, max_output_tokens=1)
    assert info.value.field == "provider"


def test_the_provider_is_part_of_the_price_key() -> None:
    seed()
    with pytest.raises(UnknownPrice):
        budgets.reserve(
            tenant="acme", provider="other", model=FAKE_MODEL, input_tokens=0, max_output_tokens=1
        )
    assert reserve_30().reservation.provider == FAKE_PROVIDER


def test_the_star_budget_is_a_cap_for_each_end_user_not_a_shared_pool() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("50"), window="day")
    reserve_30(end_user="u-1")
    reserve_30(end_user="u-2")  # u-2's own 50, untouched by u-1's hold
    with pytest.raises(BudgetExceeded) as info:
        reserve_30(end_user="u-1")
    assert (info.value.scope, info.value.remaining) == ("end user acme/*", Decimal(20))
    by_user = {s.scope: s.reserved for s in budgets.status(tenant="acme", end_user="u-2")}
    assert by_user[Scope.END_USER_DEFAULT] == Decimal(30)
    assert by_user[Scope.TENANT] == Decimal(60)
    # Someone not seen yet has the whole default.
    fresh = {s.scope: s.remaining for s in budgets.status(tenant="acme", end_user="new")}
    assert fresh[Scope.END_USER_DEFAULT] == Decimal(50)


def test_a_retry_asking_a_dearer_service_tier_does_not_ride_the_first_hold() -> None:
    """Review finding: the retry of a standard-tier call asking ``priority`` with the same key
    got the standard reservation back, and its commit was priced at the standard rates."""
    seed(limit="1000")
    budgets.set_price(
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_per_mtok=Decimal(0),
        output_per_mtok=Decimal(30000),
        service_tiers={"priority": {"input_per_mtok": "0", "output_per_mtok": "60000"}},
        effective_from=PRICES_START + timedelta(seconds=1),
    )
    asked = {"tenant": "acme", "provider": FAKE_PROVIDER, "model": FAKE_MODEL, "input_tokens": 0}
    held = reservation_create(**asked, max_output_tokens=1000, idempotency_key="k")
    with pytest.raises(IdempotencyKeyReused) as refused:
        reservation_create(
            **asked, max_output_tokens=1000, idempotency_key="k", service_tier="priority"
        )
    assert refused.value.differs == "service_tier"
    assert refused.value.reservation_id == str(held.pk)
    assert reservation_create(**asked, max_output_tokens=1000, idempotency_key="k") == held


def test_a_call_larger_than_the_whole_limit_is_told_no_reset_makes_room(acme: None) -> None:
    seed(tenant="acme", limit="1000")
    budgets.set_limit(tenant="acme", end_user="small", amount=Decimal(20), window="day")
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(end_user="small")
    error = refused.value
    assert error.beyond_limit
    assert "larger than the whole limit, so no reset makes room for it" in str(error)
    assert "resets at" not in str(error)
    # No Retry-After that would invite a retry bound to fail.
    assert (error.resets_at, error.retry_after) == (None, None)
    # One that merely does not fit now still says when the budget resets.
    budgets.set_limit(tenant="acme", end_user="small", amount=Decimal(45), window="day")
    reserve_30(end_user="small")
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(end_user="small")
    assert not refused.value.beyond_limit
    assert "It resets at" in str(refused.value)
    assert refused.value.retry_after is not None
