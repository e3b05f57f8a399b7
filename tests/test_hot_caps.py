"""Hot caps (issue #15 part 1, docs/design/hot-caps.md): a budget's counter split into stripes,
admitted on one stripe's allowance when it has room (fast path), else on the whole cap with
every stripe locked (exact path). On both databases; the races are in test_hot_caps_race.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from llm_budgets import budgets
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine import stripes
from llm_budgets.engine.admission import reservation_create
from llm_budgets.engine.settlement import reservation_commit, reservation_release
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage
from llm_budgets.jobs.reconcile import allowances_excess, counters_drift
from llm_budgets.models import AuditEvent, Budget, BudgetRaise, Counter
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.tenancy.tenants import tenant_get
from tests.api import BASE, client_for, new_key
from tests.concurrency import overspent_counters
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, price_fake, reserve_30

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _hot_cap(limit: str = "100", *, stripes: int = 4, window: str = "month") -> Budget:
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    result = budgets.set_limit(
        tenant="acme", amount=Decimal(limit), window=window, hot=True, stripes=stripes
    )
    return Budget.objects.get(pk=result.id)


def _reserve(amount: int, *, at: datetime = NOW, **kwargs: object) -> object:
    """A hold of ``amount`` (an output token costs 0.03: 100 tokens hold 3)."""
    return reservation_create(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=amount * 100 // 3,
        now=at,
        **kwargs,
    )


def _stripes(budget: Budget) -> list[Counter]:
    return list(Counter.objects.filter(budget=budget).order_by("period_start", "stripe"))


def _status(at: datetime = NOW) -> object:
    (status,) = budget_statuses(tenant_get("acme"), None, at)
    return status


def _consistent() -> None:
    assert counters_drift() == []
    assert overspent_counters() == []
    assert allowances_excess() == []


def test_first_admission_splits_the_cap_and_later_ones_take_one_stripe() -> None:
    budget = _hot_cap("100", stripes=4)

    first = _reserve(3)  # the exact path: creates the 4 stripes and splits the room left
    rows = _stripes(budget)
    assert [c.stripe for c in rows] == [0, 1, 2, 3]
    assert {c.split_for for c in rows} == {Decimal(100)}
    assert sum(c.allowance - c.spent - c.reserved for c in rows) == Decimal(97)
    assert [h.counter.stripe for h in first.holds.all()] == [0]

    allowances = {c.pk: c.allowance for c in rows}
    _reserve(3)  # the fast path: one stripe, allowances untouched
    after = _stripes(budget)
    assert {c.pk: c.allowance for c in after} == allowances
    assert sum(c.reserved for c in after) == Decimal(6)
    status = _status()
    assert (status.limit, status.reserved, status.remaining) == (100, 6, 94)  # one number
    _consistent()


def test_never_refused_while_the_whole_cap_has_room() -> None:
    # 8 stripes of 100 hold 12.5 each: a call of 60 fits no stripe, but fits the cap.
    budget = _hot_cap("100", stripes=8)
    _reserve(3)
    assert max(c.allowance - c.reserved for c in _stripes(budget)) < 60

    held = _reserve(60)

    assert held.holds.get().counter.reserved >= Decimal(60)
    assert _status().remaining == Decimal(37)
    # 37 left: a call of 40 is refused with the whole cap's numbers.
    with pytest.raises(BudgetExceeded) as refused:
        _reserve(39)
    assert (refused.value.limit, refused.value.remaining) == (100, 37)
    _reserve(36)  # ...and 36 of them are still admitted
    assert _status().remaining == Decimal(1)
    _consistent()


def test_exactly_the_room_is_admitted_one_call_at_a_time() -> None:
    budget = _hot_cap("100", stripes=8)
    admitted, refusals = 0, []
    for _ in range(40):
        try:
            _reserve(3)
            admitted += 1
        except BudgetExceeded as exc:
            refusals.append(exc)
    assert admitted == 33  # floor(100 / 3)
    assert all(r.remaining == 1 < r.requested for r in refusals)  # none early
    assert sum(c.reserved for c in _stripes(budget)) == Decimal(99)
    _consistent()


def test_a_release_frees_room_that_the_exact_path_finds() -> None:
    budget = _hot_cap("30", stripes=4)
    holds = [_reserve(3) for _ in range(10)]
    with pytest.raises(BudgetExceeded):
        _reserve(3)
    for hold in holds[:4]:
        reservation_release(hold.pk, now=NOW)
    # 12 free, spread over whichever stripes the holds were on: a call of 12 still fits.
    _reserve(12)
    assert sum(c.reserved for c in _stripes(budget)) == Decimal(30)
    _consistent()


def test_an_expired_raise_does_not_let_stripes_admit_on_its_allowance() -> None:
    # The effective limit changes without a write: allowances split for 100 + 50 must not
    # admit once the raise is over.
    budget = _hot_cap("100", stripes=4)
    budget_raise_grant(
        budget=budget, amount=50, until=NOW + timedelta(hours=1), reason="demo", now=NOW
    )
    for _ in range(40):
        _reserve(3)  # 120 held under the raised 150
    assert {c.split_for for c in _stripes(budget)} == {Decimal(150)}
    later = NOW + timedelta(hours=2)

    with pytest.raises(BudgetExceeded) as refused:
        _reserve(3, at=later)

    assert (refused.value.limit, refused.value.remaining) == (100, 0)
    assert sum(c.reserved for c in _stripes(budget)) == Decimal(120)


def test_a_lower_limit_stops_stripes_with_allowance_left() -> None:
    budget = _hot_cap("100", stripes=4)
    for _ in range(10):
        _reserve(3)  # 30 held; each stripe still has allowance left
    assert all(c.allowance > c.spent + c.reserved for c in _stripes(budget))

    budgets.set_limit(tenant="acme", amount=Decimal(31), window="month")

    with pytest.raises(BudgetExceeded) as refused:
        _reserve(3)
    assert (refused.value.limit, refused.value.remaining) == (31, 1)
    _reserve(1)  # 0.99 of the last 1 fits, decided on the whole cap
    with pytest.raises(BudgetExceeded):
        _reserve(1)
    assert sum(c.reserved for c in _stripes(budget)) == Decimal("30.99")
    _consistent()


def test_commit_settles_on_the_stripe_and_status_sums_spend() -> None:
    budget = _hot_cap("100", stripes=4)
    holds = [_reserve(6) for _ in range(5)]
    for hold in holds[:3]:
        reservation_commit(hold.pk, input_tokens=0, output_tokens=100, now=NOW)  # costs 3
    status = _status()
    assert (status.spent, status.reserved, status.remaining) == (9, 12, 79)
    assert sum(c.spent for c in _stripes(budget)) == Decimal(9)
    _consistent()


def test_a_new_period_gets_its_own_stripes() -> None:
    budget = _hot_cap("10", stripes=2)
    for _ in range(3):
        _reserve(3)
    with pytest.raises(BudgetExceeded) as refused:
        _reserve(3)
    assert refused.value.resets_at == datetime(2026, 4, 1, tzinfo=UTC)

    _reserve(3, at=datetime(2026, 4, 1, 0, 1, tzinfo=UTC))

    periods = {c.period_start for c in _stripes(budget)}
    assert periods == {datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)}
    assert _status(datetime(2026, 4, 1, 0, 2, tzinfo=UTC)).reserved == Decimal(3)
    _consistent()


def test_turning_hot_off_checks_the_sum_and_forgets_the_split() -> None:
    budget = _hot_cap("30", stripes=4)
    for _ in range(5):
        _reserve(3)

    budgets.set_limit(tenant="acme", amount=Decimal(30), window="month", hot=False)

    assert all(c.split_for is None for c in _stripes(budget))
    for _ in range(5):
        _reserve(3)  # on stripe 0, checked on the sum of all four
    with pytest.raises(BudgetExceeded) as refused:
        _reserve(3)
    assert refused.value.remaining == 0
    # Hot again: the next call splits what is left (nothing) and is refused on the sum.
    budgets.set_limit(tenant="acme", amount=Decimal(30), window="month", hot=True)
    with pytest.raises(BudgetExceeded):
        _reserve(1)
    _consistent()
    event = AuditEvent.objects.filter(action="budget.change_limit").latest("pk")
    assert (event.before["hot"], event.after["hot"]) == (False, True)


def test_rolling_budgets_marked_hot_take_the_exact_path() -> None:
    budget = _hot_cap("10", stripes=4, window="rolling:1h")
    for _ in range(3):
        _reserve(3)
    with pytest.raises(BudgetExceeded):
        _reserve(3)
    assert [(c.stripe, c.allowance) for c in _stripes(budget)] == [(0, None)]


def test_degrading_calls_decide_on_the_whole_cap() -> None:
    budget = _hot_cap("100", stripes=4)
    for _ in range(10):
        _reserve(3)
    _reserve(3, allow_degrade=True)  # the exact path: locks every stripe, splits again
    assert sum(c.reserved for c in _stripes(budget)) == Decimal(33)
    _consistent()


def test_set_limit_refuses_a_bad_hot_or_stripes() -> None:
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    with pytest.raises(InvalidUsage) as bad:
        budgets.set_limit(tenant="acme", amount=Decimal(1), window="day", hot="yes")  # type: ignore[arg-type]
    assert bad.value.field == "hot"
    with pytest.raises(InvalidUsage) as bad:
        budgets.set_limit(tenant="acme", amount=Decimal(1), window="day", hot=True, stripes=65)
    assert bad.value.field == "stripes"
    assert not Budget.objects.filter(tenant__external_id="acme").exists()


def test_reconcile_reports_allowances_that_promise_more_than_the_room() -> None:
    budget = _hot_cap("100", stripes=4)
    _reserve(3)
    call_command("llm_budgets_reconcile")
    stripe = _stripes(budget)[1]
    stripe.allowance += Decimal("0.5")  # a torn split: the stripes could admit 100.5
    stripe.save()

    (excess,) = allowances_excess()
    assert excess.excess == Decimal("0.5")
    with pytest.raises(CommandError, match="allowance invariant"):
        call_command("llm_budgets_reconcile")


def test_allowance_excess_nets_out_recorded_overage() -> None:
    rows = [
        Counter(stripe=0, spent=Decimal(40), reserved=0, allowance=Decimal(30), split_for=100),
        Counter(stripe=1, spent=Decimal(0), reserved=0, allowance=Decimal(35), split_for=100),
    ]
    # 10 over on stripe 0 (a commit above its hold): stripe 1 may still admit 35, to 75 of 100.
    assert stripes.allowance_excess(rows) == 0
    rows[1].allowance = Decimal(70)  # 70 + 40 = 110: 10 past, more than the overage explains
    assert stripes.allowance_excess(rows) == Decimal(0)
    rows[1].allowance = Decimal(71)
    assert stripes.allowance_excess(rows) == Decimal(1)


def test_resplit_keeps_the_invariant_with_equality() -> None:
    rows = [Counter(stripe=s, spent=Decimal(s), reserved=Decimal("0.1")) for s in range(3)] + [
        Counter(stripe=5, spent=Decimal(2), reserved=0)
    ]  # a stripe beyond K: no share
    stripes.resplit(rows, Decimal(10), 3)
    free = sum(c.allowance - c.spent - c.reserved for c in rows)
    assert free == Decimal(10) - sum(c.spent + c.reserved for c in rows)
    assert rows[3].allowance == Decimal(2)
    assert {c.split_for for c in rows} == {Decimal(10)}
    stripes.resplit(rows, Decimal(1), 3)  # below what is used: no stripe has room
    assert all(c.allowance == c.spent + c.reserved for c in rows)


def test_the_rest_api_sets_and_shows_hot() -> None:
    price_fake()
    budgets.ensure_tenant(tenant="acme")
    response = client_for(new_key()).post(
        f"{BASE}budgets",
        {"tenant": "acme", "window": "day", "amount": "10", "hot": True, "stripes": 4},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert (response.json()["hot"], response.json()["stripes"]) == (True, 4)
    budget = Budget.objects.get(tenant__external_id="acme", window="day")
    assert (budget.hot, budget.stripes) == (True, 4)


def test_the_admin_toggles_hot_and_shows_the_cap_as_one_number(admin_client: Client) -> None:
    budget = _hot_cap("100", stripes=4)
    for _ in range(4):
        reserve_30(max_output_tokens=100)  # 3 each: 12 held, on several stripes
    url = reverse("admin:llm_budgets_budget_change", args=[budget.pk])
    page = strip_tags(admin_client.get(url).content.decode())
    assert "reserved 12.00" in page  # the stripes summed, not one stripe's part

    response = admin_client.post(
        url, {"limit": "100", "stripes": "2", "reason": "calmer now", "_save": "1"}
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    budget.refresh_from_db()
    assert (budget.hot, budget.stripes) == (False, 2)  # an unticked box: not hot
    assert all(c.split_for is None for c in _stripes(budget))
    event = AuditEvent.objects.filter(action="budget.change_limit").latest("pk")
    assert (event.actor, event.reason, event.after["hot"]) == ("admin", "calmer now", False)


def test_the_overspend_check_sums_stripes_and_allows_raises_and_ceilings() -> None:
    """The races' and the soak's overspend check (``tests.concurrency``) can fail: a cap past its
    limit over its stripes is reported until a higher ceiling staff set meanwhile, or a raise,
    accounts for it."""
    budget = _hot_cap("100", stripes=4)
    _reserve(3)
    Counter.objects.filter(budget=budget, stripe=1).update(spent=Decimal(60))
    Counter.objects.filter(budget=budget, stripe=2).update(spent=Decimal(60))
    over = overspent_counters()
    assert len(over) == 1, over  # 123 on the cap, 60 on no stripe
    assert "spent + reserved 123.0000000000 > limit 100.0000000000 + raises 0" in over[0]
    assert overspent_counters({budget.pk: Decimal(130)}) == []
    assert overspent_counters({budget.pk: Decimal(50)}) == over  # a ceiling never lowers
    BudgetRaise.objects.create(
        budget=budget,
        amount=Decimal(23),
        starts_at=NOW,
        ends_at=NOW + timedelta(days=1),
        reason="t",
    )
    assert overspent_counters() == []
