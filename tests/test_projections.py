"""Projections (``reads.projections``): their error on a synthetic month with a known trend, when a
budget runs out, and where they show (``status``, the REST status, the overview's cards)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine

from llm_budgets import budgets
from llm_budgets.reads.projections import project
from tests.factories import reserve_30, seed

START = datetime(2026, 11, 1, tzinfo=UTC)  # a 30-day month, in UTC
DAYS = 30


def synthetic_month(seed_: int, *, growth: float = 0.03) -> dict[int, Decimal]:
    """Day k's spend (k < 0: the previous month): 10 a day growing by ``growth`` of that a day,
    weekends at 40% of a weekday, each day off by up to ±10% at random."""
    rng = random.Random(seed_)
    days = {}
    for k in range(-28, DAYS):
        weekend = 0.4 if (START + timedelta(days=k)).weekday() >= 5 else 1.0
        value = 10 * (1 + growth * k) * weekend * (1 + rng.uniform(-0.1, 0.1))
        days[k] = Decimal(str(round(value, 4)))
    return days


def relative_errors(days: dict[int, Decimal], since_day: int) -> tuple[list[float], list[float]]:
    """The projection's error against the month's real total, at noon of each day from
    ``since_day`` (0-based), and the error of a flat run rate (spent so far / time so far)."""
    actual = sum(days[k] for k in range(DAYS))
    ours, flat = [], []
    for d in range(since_day, DAYS):
        day_start = START + timedelta(days=d)
        used = sum(days[k] for k in range(d)) + days[d] / 2  # half of today, at noon
        found = project(
            used=used,
            limit=Decimal(10**6),
            history=[days[k] for k in range(d - 28, d)],
            now=day_start + timedelta(hours=12),
            day_start=day_start,
            period_end=START + timedelta(days=DAYS),
        )
        assert found is not None
        ours.append(float(abs(found.projected - actual) / actual))
        run_rate = used / Decimal(d + 0.5) * DAYS
        flat.append(float(abs(run_rate - actual) / actual))
    return ours, flat


@pytest.mark.parametrize("growth", [0.03, 0.0, -0.02])
def test_the_projection_is_within_its_stated_error_on_a_month_with_a_known_trend(
    growth: float,
) -> None:
    """docs/pages.md states these bounds: from the 8th day on, 2.5% on average and 15% at worst
    (20 months of each trend); from the 15th, 7% at worst."""
    errors: list[float] = []
    late: list[float] = []
    flat_errors: list[float] = []
    for month in range(20):
        days = synthetic_month(month, growth=growth)
        ours, flat = relative_errors(days, 7)
        errors += ours
        flat_errors += flat
        late += ours[7:]
    mean = sum(errors) / len(errors)
    assert mean < 0.025, mean
    assert max(errors) < 0.15, max(errors)
    assert max(late) < 0.07, max(late)
    # Better than the flat run rate a month-to-date figure suggests; far better with a trend.
    flat_mean = sum(flat_errors) / len(flat_errors)
    assert mean < (flat_mean / 2 if growth else flat_mean)
    print(f"growth {growth}: mean {mean:.2%} max {max(errors):.2%} late max {max(late):.2%}")
    print(f"flat run rate: mean {flat_mean:.2%} max {max(flat_errors):.2%}")


def test_it_says_when_the_budget_runs_out_and_only_if_before_the_reset() -> None:
    day_start = START + timedelta(days=10)
    common: dict[str, Any] = {
        "history": [Decimal(10)] * 28,  # 10 a day, every day
        "now": day_start + timedelta(hours=12),
        "day_start": day_start,
        "period_end": START + timedelta(days=DAYS),
    }
    found = project(used=Decimal(105), limit=Decimal(205), **common)
    assert found is not None
    # 100 more at 10 a day: ten days from now.
    assert found.runs_out_at == common["now"] + timedelta(days=10)
    assert found.projected == Decimal(105) + Decimal("195")  # 19.5 days left
    assert found.rate == Decimal(10)
    roomy = project(used=Decimal(105), limit=Decimal(1000), **common)
    assert roomy is not None
    assert roomy.runs_out_at is None
    over = project(used=Decimal(300), limit=Decimal(205), **common)
    assert over is not None
    assert over.runs_out_at is None  # already out: nothing to foresee
    assert project(used=Decimal(1), limit=Decimal(5), **{**common, "history": []}) is None


@pytest.mark.django_db
@pytest.mark.usefixtures("application_clock")
def test_status_and_the_rest_api_show_the_projection(settings: Any) -> None:
    from tests.api import BASE, client_for, new_key

    # 3.00 a day for a week (100 output tokens at the fixture's 0.03), against a month of 100.
    for day in range(1, 8):
        with time_machine.travel(datetime(2026, 11, day, 12, tzinfo=UTC), tick=False):
            if day == 1:
                seed(tenant="acme", limit="100")
            reserve_30(tenant="acme").commit(input_tokens=0, output_tokens=100)
    with time_machine.travel(datetime(2026, 11, 8, 0, tzinfo=UTC), tick=False):
        status = next(s for s in budgets.status(tenant="acme") if s.scope == "tenant")
        assert status.spent == Decimal(21)
        # 21 now and 3.00 a day for the 23 days left: 90, not out before the reset.
        assert status.projected == Decimal(90)
        assert status.runs_out_at is None
        budgets.set_limit(tenant="acme", amount=Decimal(60), window="month")
        status = next(s for s in budgets.status(tenant="acme") if s.scope == "tenant")
        assert status.runs_out_at == datetime(2026, 11, 21, 0, tzinfo=UTC)  # 39 more: 13 days
        body = client_for(new_key("acme")).get(f"{BASE}tenants/acme/status").json()
        tenant = next(b for b in body["budgets"] if b["scope"] == "tenant")
        assert Decimal(tenant["projected"]) == Decimal(90)
        assert tenant["runs_out_at"].startswith("2026-11-21T00:00:00")
        # The overview's sentence and the organisation's card (in the tenant's timezone, UTC).
        from django.contrib.auth.models import User
        from django.test import Client

        from llm_budgets.models import Membership, MembershipRole, Tenant

        user = User.objects.create_user("ann", password="pw")
        tenant_obj = Tenant.objects.get(external_id="acme")
        Membership.objects.create(user=user, tenant=tenant_obj, role=MembershipRole.ADMIN)
        browser = Client()
        browser.force_login(user)
        page = browser.get("/usage/").content.decode()
        assert "At this rate the budget runs out on 21 Nov 2026, before it resets." in page
        card = page[page.index('data-figure="projection"') :]
        assert "At this rate it runs out on 21 Nov 2026, before it resets (" in card
        # The daily chart's running total: the limit line and the projection to the period's end.
        charts = browser.get("/usage/models/").content.decode()
        assert 'class="lb-limit"' in charts
        assert '<polyline class="lb-projection"' in charts
        assert "At the recent rate the limit of" in charts
        assert "is reached on 21 Nov 2026, before it resets" in charts


@pytest.mark.django_db
@pytest.mark.usefixtures("application_clock")
def test_a_daily_budget_is_projected_to_the_end_of_its_day(settings: Any) -> None:
    # 3.00 a day for a week, each at noon (UTC, the tenant's zone), under a month of 100.
    for day in range(1, 8):
        with time_machine.travel(datetime(2026, 11, day, 12, tzinfo=UTC), tick=False):
            if day == 1:
                seed(tenant="acme", limit="100")
            reserve_30(tenant="acme").commit(input_tokens=0, output_tokens=100)
    with time_machine.travel(datetime(2026, 11, 8, 12, tzinfo=UTC), tick=False):
        budgets.set_limit(tenant="acme", amount=Decimal(5), window="day")
        reserve_30(tenant="acme", max_output_tokens=50).commit(input_tokens=0, output_tokens=50)
        daily = next(s for s in budgets.status(tenant="acme") if s.window == "day")
        # 1.50 today by noon, and 3.00 a day for the half day left: 3.00, within 5.
        assert daily.spent == Decimal("1.5")
        assert daily.projected == Decimal(3)
        assert daily.runs_out_at is None
        budgets.set_limit(tenant="acme", amount=Decimal(2), window="day")
        daily = next(s for s in budgets.status(tenant="acme") if s.window == "day")
        # 0.50 more at 3.00 a day: a sixth of a day, four hours.
        assert daily.runs_out_at == datetime(2026, 11, 8, 16, tzinfo=UTC)
        monthly = next(s for s in budgets.status(tenant="acme") if s.window == "month")
        assert monthly.projected is not None  # the monthly one still has its own
        from django.contrib.auth.models import User
        from django.test import Client

        from llm_budgets.models import Membership, MembershipRole, Tenant

        user = User.objects.create_user("ann", password="pw")
        tenant_obj = Tenant.objects.get(external_id="acme")
        Membership.objects.create(user=user, tenant=tenant_obj, role=MembershipRole.ADMIN)
        browser = Client()
        browser.force_login(user)
        page = browser.get("/usage/").content.decode()
        assert "At this rate it runs out at 16:00 UTC today, before it resets" in page
        # The overview's sentence is about the month, not the day's budget.
        assert "At this rate: " in page.split('data-figure="projection"')[0]
