"""Refused calls leave no rows (issue #22.9): end users, runs and counters are created only by
the transaction that admits a call; refusals keep the ids they were asked for; a per-tenant cap
bounds how many new end users and runs a tenant's calls bring in per 24 hours."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client, override_settings

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded, KillSwitchActive, NewIdCapped
from llm_budgets.models import (
    Counter,
    EndUser,
    Membership,
    MembershipRole,
    Refusal,
    Reservation,
    Run,
    Tenant,
)
from tests.api import BASE, new_key, reserve_body
from tests.api import client_for as api_client
from tests.concurrency import patient_lock_waits, run_threads
from tests.factories import reserve_30, seed


def _refused(**kwargs: Any) -> None:
    with pytest.raises(BudgetExceeded):
        reserve_30(**kwargs)


@pytest.mark.django_db
def test_150_refused_calls_create_no_end_user_run_or_counter() -> None:
    seed(limit="10")  # every call's worst case is 30: each is refused
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(100), window="day")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal(100), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("feature", "chat"), amount=Decimal(100), window="month")
    rows = (EndUser.objects.count(), Run.objects.count(), Counter.objects.count())
    for i in range(150):
        _refused(end_user=f"u-{i}", run=f"run-{i}", tags={"feature": "chat"})
    assert (EndUser.objects.count(), Run.objects.count(), Counter.objects.count()) == rows
    assert Reservation.objects.count() == 0
    # Each refusal keeps what it was asked for.
    assert Refusal.objects.count() == 150
    refusal = Refusal.objects.get(end_user_external_id="u-7")
    assert (refusal.run_external_id, refusal.end_user_id) == ("run-7", None)


@pytest.mark.django_db
def test_a_call_stopped_by_a_kill_switch_creates_nothing_either() -> None:
    seed(limit="1000")
    budgets.trip(tenant="acme", reason="maintenance")
    with pytest.raises(KillSwitchActive):
        reserve_30(end_user="new-user", run="new-run")
    assert (EndUser.objects.count(), Run.objects.count()) == (0, 0)
    refusal = Refusal.objects.get()
    assert (refusal.end_user_external_id, refusal.run_external_id) == ("new-user", "new-run")


@pytest.mark.django_db
def test_an_admitted_first_call_creates_its_end_user_run_and_counters() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(100), window="day")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal(50), window="lifetime")
    hold = reserve_30(end_user="new-user", run="new-run")
    user, run = EndUser.objects.get(), Run.objects.get()
    assert (user.external_id, run.external_id) == ("new-user", "new-run")
    reservation = Reservation.objects.get()
    assert (reservation.end_user_id, reservation.run_id) == (user.pk, run.pk)
    assert Counter.objects.filter(end_user=user, reserved=30).count() == 1
    assert Counter.objects.filter(run=run, reserved=30).count() == 1
    hold.release()
    # The run's own "*" share now exists: a second call uses it, and it refuses past 50.
    reserve_30(end_user="new-user", run="new-run")
    _refused(end_user="new-user", run="new-run")


@pytest.mark.django_db
def test_a_member_sees_the_refusals_of_an_end_user_the_ledger_never_created() -> None:
    from django.contrib.auth.models import User

    seed(limit="10")
    _refused(end_user="carol")
    user = User.objects.create_user("carol", password="pw")  # type: ignore[arg-type]
    Membership.objects.create(
        user=user,
        tenant=Tenant.objects.get(external_id="acme"),
        role=MembershipRole.MEMBER,
        end_user_external_id="carol",
    )
    client = Client()
    client.force_login(user)
    text = client.get("/usage/refusals/").content.decode()
    assert "for user carol" in text
    assert not EndUser.objects.exists()


@pytest.mark.django_db
def test_new_end_users_beyond_the_daily_cap_are_refused_with_a_clear_error() -> None:
    seed(limit="1000")
    with override_settings(LLM_BUDGETS={"NEW_END_USERS_PER_DAY": 2, "NEW_RUNS_PER_DAY": 1}):
        reserve_30(end_user="a").release()
        reserve_30(end_user="b").release()
        with pytest.raises(NewIdCapped) as capped:
            reserve_30(end_user="c")
        assert (capped.value.kind, capped.value.new_id, capped.value.cap) == ("end_user", "c", 2)
        assert 0 < capped.value.retry_after <= 24 * 3600
        assert "NEW_END_USERS_PER_DAY" in str(capped.value)
        reserve_30(end_user="a").release()  # seen before: still runs
        reserve_30(run="r-1").release()
        with pytest.raises(NewIdCapped) as capped:
            reserve_30(run="r-2")
        assert capped.value.kind == "run"
        reserve_30(run="r-1").release()
        # Over REST: 429 with the code and Retry-After.
        response = api_client(new_key("acme")).post(
            f"{BASE}reservations", reserve_body(end_user="d"), format="json"
        )
        assert response.status_code == 429
        assert response.json()["error"]["code"] == "new_id_capped"
        assert int(response["Retry-After"]) > 0
    assert EndUser.objects.count() == 2
    assert Run.objects.count() == 1
    with override_settings(LLM_BUDGETS={"NEW_END_USERS_PER_DAY": None}):
        reserve_30(end_user="c").release()  # no cap


# Concurrent first requests of an unknown user still pass its default budget: each admission
# creates the user inside its own transaction (on PostgreSQL, the second insert waits for the
# first) and locks the one counter of that user's "*" budget.


@pytest.fixture
def patient() -> Iterator[None]:
    with patient_lock_waits():
        yield


def _first_calls(index: int) -> str:
    try:
        reserve_30(end_user="newcomer", run="first-run")
    except BudgetExceeded:
        return "refused"
    return "admitted"


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("calls", [10, 30])
def test_concurrent_first_calls_of_an_unknown_user_pass_its_default_budget(
    patient: None, calls: int
) -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(100), window="day")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal(1000), window="lifetime")
    results = run_threads(calls, _first_calls)
    assert results.count("admitted") == 3, results
    assert results.count("refused") == calls - 3, results
    user = EndUser.objects.get()
    assert Run.objects.count() == 1
    (mine,) = Counter.objects.filter(end_user=user)
    assert mine.reserved == Decimal(90)
    assert Reservation.objects.filter(end_user=user).count() == 3


def _new_user_calls(index: int) -> str:
    try:
        reserve_30(end_user=f"newcomer-{index}").release()
    except NewIdCapped:
        return "capped"
    return "admitted"


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_concurrent_first_calls_of_new_users_stop_exactly_at_the_cap(patient: None) -> None:
    seed(limit="100000")
    with override_settings(LLM_BUDGETS={"NEW_END_USERS_PER_DAY": 5}):
        results = run_threads(20, _new_user_calls)
    assert (results.count("admitted"), results.count("capped")) == (5, 15), results
    assert EndUser.objects.count() == 5
