"""Daily rollups: per local day, end user and model; rebuilt idempotently from the ledger."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from llm_budgets import budgets
from llm_budgets.engine.settlement import reservation_commit, reservations_sweep
from llm_budgets.jobs.rollups import daily_usage_rebuild, daily_usage_refresh, daily_usage_totals
from llm_budgets.models import Counter, DailyUsage, Reservation
from llm_budgets.tenancy.tenants import tenant_get
from tests.factories import price_fake, reserve_30_at

pytestmark = pytest.mark.django_db

# 23:30 UTC on March 9 is already March 10 in Amsterdam (UTC+1).
LATE_EVENING = datetime(2026, 3, 9, 23, 30, tzinfo=UTC)


@pytest.fixture
def amsterdam() -> None:
    price_fake(effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Amsterdam")
    budgets.set_limit(tenant="acme", amount=Decimal(1000), window="month")


def _charge(at: datetime, output_tokens: int, end_user: str | None = None) -> None:
    from llm_budgets.engine.admission import reservation_create

    reservation = reservation_create(
        tenant="acme",
        end_user=end_user,
        provider="fake",
        model="m30",
        input_tokens=0,
        max_output_tokens=1000,
        now=at,
    )
    reservation_commit(reservation.pk, input_tokens=0, output_tokens=output_tokens, now=at)


@pytest.mark.usefixtures("amsterdam")
def test_lines_are_bucketed_by_the_tenants_local_day() -> None:
    _charge(LATE_EVENING - timedelta(hours=1), 100)  # 22:30 UTC = 23:30 local, March 9
    _charge(LATE_EVENING, 200)  # local March 10
    _charge(LATE_EVENING, 300, end_user="u-1")
    assert daily_usage_rebuild(since=date(2026, 3, 8), until=date(2026, 3, 11)) == 3
    totals = daily_usage_totals(tenant_get("acme"), since=date(2026, 3, 1), until=date(2026, 3, 31))
    assert [(t.day, t.calls, t.output_tokens, t.cost) for t in totals] == [
        (date(2026, 3, 9), 1, 100, Decimal(3)),
        (date(2026, 3, 10), 2, 500, Decimal(15)),
    ]
    user_rows = DailyUsage.objects.filter(end_user__external_id="u-1")
    assert [(r.day, r.cost) for r in user_rows] == [(date(2026, 3, 10), Decimal(9))]


@pytest.mark.usefixtures("amsterdam")
def test_rebuild_is_idempotent_and_follows_late_true_ups() -> None:
    reserve_30_at(LATE_EVENING, ttl=60)
    reservations_sweep(now=LATE_EVENING + timedelta(minutes=5))  # charged 30 as estimated
    daily_usage_rebuild(since=date(2026, 3, 10), until=date(2026, 3, 10))
    [row] = DailyUsage.objects.all()
    assert (row.cost, row.estimated_cost, row.calls) == (Decimal(30), Decimal(30), 1)
    # The real usage arrives a day later: its true-up belongs to the reservation's day.
    reservation_commit(
        Reservation.objects.get().pk,
        input_tokens=0,
        output_tokens=100,
        now=LATE_EVENING + timedelta(days=1),
    )
    for _ in range(2):
        daily_usage_rebuild(since=date(2026, 3, 9), until=date(2026, 3, 11))
    [row] = DailyUsage.objects.all()
    assert (row.day, row.cost, row.estimated_cost, row.calls) == (
        date(2026, 3, 10),
        Decimal(3),
        Decimal(30),
        1,
    )
    # A month of rollups adds up to the month's counter.
    assert row.cost == Counter.objects.get().spent


@pytest.mark.usefixtures("amsterdam")
def test_the_job_and_the_command_rebuild_recent_days() -> None:
    _charge(LATE_EVENING, 100)
    assert daily_usage_refresh(now=LATE_EVENING + timedelta(days=2)) == 1
    DailyUsage.objects.all().delete()
    assert daily_usage_refresh(now=LATE_EVENING + timedelta(days=10)) == 0  # out of lookback
    out = StringIO()
    call_command("llm_budgets_rollup", "--all", stdout=out)
    assert "Wrote 1 daily usage row(s)." in out.getvalue()
    call_command("llm_budgets_rollup", "--since", "2026-03-10", "--until", "2026-03-10", stdout=out)
    assert DailyUsage.objects.count() == 1


@pytest.mark.usefixtures("amsterdam")
def test_tenant_rollups_sum_the_end_users_and_are_replaced_on_rebuild() -> None:
    from llm_budgets.models import TenantDailyUsage

    _charge(LATE_EVENING, 100, end_user="u-1")
    _charge(LATE_EVENING, 200, end_user="u-2")
    _charge(LATE_EVENING, 50)
    for _ in range(2):  # a second rebuild replaces, never adds
        daily_usage_rebuild(since=date(2026, 3, 8), until=date(2026, 3, 11))
        tenant_row = TenantDailyUsage.objects.get()
        assert tenant_row.day == date(2026, 3, 10)  # Amsterdam's day
        users = DailyUsage.objects.filter(day=tenant_row.day)
        assert users.count() == 3
        assert tenant_row.calls == 3
        assert tenant_row.output_tokens == 350
        assert tenant_row.cost == sum(row.cost for row in users) == Decimal("10.5")
