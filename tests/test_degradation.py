"""The degradation ladder (issue 5, item 4): each rung, opt-in per plan and per request, the same
budgets for the degraded request, and no overspend under real concurrency."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, KillSwitchActive
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Plan, Refusal, Reservation, ReservationState
from tests.concurrency import run_threads
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, PRICES_START, reserve_30, seed

pytestmark = pytest.mark.django_db

CHEAP = "m10"  # 1000 output tokens hold 10
LADDER = [
    {"at_percent": 80, "models": {FAKE_MODEL: CHEAP}},
    {"at_percent": 95, "max_output_tokens": 100},
]


def _setup(*, ladder: list[dict[str, object]] | None = LADDER, limit: str = "100") -> None:
    seed(limit=limit)
    budgets.set_price(
        provider=FAKE_PROVIDER,
        model=CHEAP,
        input_per_mtok=Decimal(0),
        output_per_mtok=Decimal(10000),
        effective_from=PRICES_START,
    )
    Plan.objects.create(name="degrading", degradation_ladder=ladder or [])
    budgets.ensure_tenant(tenant="acme", plan="degrading")


def _use(amount_tokens: int) -> None:
    """Hold ``amount_tokens`` x 0.03 on the tenant's budget."""
    reserve_30(max_output_tokens=amount_tokens)


def test_below_the_first_rung_nothing_changes() -> None:
    _setup()
    _use(2000)  # 60 %
    hold = reserve_30(allow_degrade=True)
    assert (hold.model, hold.max_output_tokens, hold.amount, hold.degraded) == (
        FAKE_MODEL,
        1000,
        Decimal(30),
        False,
    )


def test_at_80_percent_the_model_is_substituted_and_priced_as_served() -> None:
    _setup()
    _use(2667)  # 80.01 %
    hold = reserve_30(allow_degrade=True)
    assert (hold.model, hold.requested_model, hold.max_output_tokens, hold.degraded) == (
        CHEAP,
        FAKE_MODEL,
        1000,
        True,
    )
    assert hold.amount == Decimal(10)
    reservation = Reservation.objects.get(pk=hold.id)
    assert (reservation.model, reservation.requested_model, reservation.price.model) == (
        CHEAP,
        FAKE_MODEL,
        CHEAP,
    )
    assert hold.commit(input_tokens=0, output_tokens=500).cost == Decimal(5)
    assert counters_drift() == []


def test_at_95_percent_the_output_ceiling_is_capped_too() -> None:
    _setup()
    _use(3170)  # 95.1 %
    hold = reserve_30(allow_degrade=True)
    assert (hold.model, hold.max_output_tokens, hold.amount, hold.degraded) == (
        CHEAP,
        100,
        Decimal(1),
        True,
    )


def test_at_100_percent_even_the_degraded_request_is_refused_and_recorded() -> None:
    _setup()
    _use(3320)  # 99.6 %: 0.4 left, the degraded worst case is 1
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(allow_degrade=True)
    assert refused.value.requested == Decimal(1)
    refusal = Refusal.objects.get()
    assert (refusal.model, refusal.requested) == (FAKE_MODEL, Decimal(1))


def test_a_request_must_opt_in() -> None:
    _setup()
    _use(2667)
    with pytest.raises(BudgetExceeded):
        reserve_30()  # 30 does not fit in 19.99, and it did not ask to be degraded


def test_a_plan_must_opt_in() -> None:
    _setup(ladder=None)
    _use(2667)
    with pytest.raises(BudgetExceeded):
        reserve_30(allow_degrade=True)


def test_the_degraded_request_counts_against_every_budget_that_applies() -> None:
    _setup()
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("5"), window="day")
    _use(2667)
    # The substitute's worst case (10) does not fit the end user's 5: refused, not granted.
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(end_user="u-1", allow_degrade=True)
    assert refused.value.scope == "end user acme/u-1"
    assert refused.value.requested == Decimal(10)


def test_the_most_used_budget_picks_the_rung() -> None:
    _setup()
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("40"), window="day")
    reserve_30(end_user="u-1", max_output_tokens=1100)  # 33 of 40 (82.5 %); tenant at 33 %
    hold = reserve_30(end_user="u-1", max_output_tokens=200, allow_degrade=True)
    assert (hold.model, hold.amount) == (CHEAP, Decimal(2))


def test_a_kill_switch_on_the_substitute_blocks_the_degradation() -> None:
    _setup()
    budgets.trip(model=CHEAP, reason="cheap model misbehaves")
    reserve_30(allow_degrade=True).release()  # below the rung: served as asked
    _use(2667)
    with pytest.raises(KillSwitchActive) as refused:
        reserve_30(allow_degrade=True)
    assert refused.value.reason == "cheap model misbehaves"


def test_allow_degrade_must_be_a_bool() -> None:
    _setup()
    with pytest.raises(InvalidUsage) as bad:
        reserve_30(allow_degrade="yes")
    assert bad.value.field == "allow_degrade"


@pytest.mark.parametrize(
    "ladder",
    [
        {"at_percent": 80},
        [{"at_percent": 120, "max_output_tokens": 10}],
        [{"at_percent": 80}],
        [{"at_percent": 80, "models": {"a": 3}}],
        [{"at_percent": 80, "max_output_tokens": 0}],
        [{"at_percent": 80, "max_output_tokens": 10, "refuse": True}],
    ],
)
def test_a_bad_ladder_is_refused_by_model_validation(ladder: object) -> None:
    plan = Plan(name="bad", degradation_ladder=ladder)
    with pytest.raises(ValidationError) as invalid:
        plan.full_clean()
    assert "degradation_ladder" in invalid.value.message_dict


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_degraded_calls_never_exceed_any_budget_under_concurrency() -> None:
    _setup(limit="100")
    for user in ("u-0", "u-1"):
        budgets.set_limit(tenant="acme", end_user=user, amount=Decimal("70"), window="day")
    workers = 4

    def work(index: int) -> list[str]:
        outcomes = []
        for _ in range(10):
            try:
                hold = reserve_30(end_user=f"u-{index % 2}", allow_degrade=True)
            except BudgetExceeded:
                outcomes.append("refused")
                continue
            outcomes.append(f"{hold.model}:{hold.amount}")
        return outcomes

    results = run_threads(workers, work)
    for result in results:
        assert isinstance(result, list), result
    granted = [o for r in results for o in r if o != "refused"]
    assert any(o.startswith(CHEAP) for o in granted), granted
    for counter in Counter.objects.select_related("budget"):
        assert counter.spent + counter.reserved <= counter.budget.limit, counter
    held = sum(
        (r.amount for r in Reservation.objects.filter(state=ReservationState.HELD)), Decimal(0)
    )
    tenant_counter = Counter.objects.get(budget__scope="tenant")
    assert tenant_counter.reserved == held
    assert counters_drift() == []


def test_a_degraded_request_is_repriced_at_customer_price_too() -> None:
    _setup()
    Plan.objects.filter(name="degrading").update(markup_percent=Decimal(50))
    # A customer-price budget of 150 (= 100 of provider cost at +50 %), at 80 % used.
    budgets.set_limit(tenant="acme", amount=Decimal("150"), window="day", unit="customer_price")
    reserve_30(max_output_tokens=2667)  # 80.01 provider cost, 120.015 customer price
    hold = reserve_30(allow_degrade=True)
    reservation = Reservation.objects.get(pk=hold.id)
    assert (reservation.model, reservation.amount, reservation.customer_amount) == (
        CHEAP,
        Decimal(10),
        Decimal(15),
    )
    day = Counter.objects.get(budget__window="day")
    assert day.reserved == Decimal("120.015") + Decimal(15)
    assert counters_drift() == []


def test_a_run_budget_filling_up_degrades_that_run_only() -> None:
    """Issue #16: the ladder reads every budget that applies, a run's own included: a run at 80 %
    of its budget is served the cheaper model while the tenant is far from its limit and other
    runs are served as asked."""
    _setup(limit="100000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("100"), window="lifetime")
    reserve_30(run="r1", max_output_tokens=2667)  # 80.01 % of r1's 100
    hold = reserve_30(run="r1", allow_degrade=True)
    assert (hold.model, hold.degraded) == (CHEAP, True)
    other = reserve_30(run="r2", allow_degrade=True)
    assert (other.model, other.degraded) == (FAKE_MODEL, False)
