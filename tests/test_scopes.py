"""Budgets per API key, per run and per tag (issue #16), in the same all-or-nothing admission."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control.api_keys import api_key_create
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine.adjustments import run_spend_reset, usage_void
from llm_budgets.engine.admission import reservation_create
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, KillSwitchActive, RunClosed
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    AuditEvent,
    Budget,
    Counter,
    Reservation,
    Run,
    Scope,
    UsageRecord,
)
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db


def _reserved() -> dict[str, D]:
    """Reserved amount of every counter, by its label."""
    return {
        str(c): c.reserved
        for c in Counter.objects.select_related("budget", "run", "api_key", "end_user")
    }


def test_each_run_gets_its_own_counter_under_run_star() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("60"), window="lifetime")
    reserve_30(run="run-1")
    reserve_30(run="run-1")
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(run="run-1")
    assert refused.value.scope == "run run-1 of acme"
    assert "run run-1 of acme" in refused.value.message
    # Another run has a counter of its own.
    reserve_30(run="run-2")
    runs = dict(
        Counter.objects.filter(run__isnull=False).values_list("run__external_id", "reserved")
    )
    assert runs == {"run-1": D("60"), "run-2": D("30")}


def test_a_call_naming_no_run_does_not_draw_on_run_budgets() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("10"), window="lifetime")
    reserve_30()  # no run: the run budget does not apply
    assert not Counter.objects.filter(run__isnull=False).exists()


def test_a_runs_own_budget_replaces_the_default_for_its_window() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("10"), window="lifetime")
    budgets.set_limit(tenant="acme", run="big", amount=D("100"), window="lifetime")
    reserve_30(run="big")
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(run="small")
    assert refused.value.scope == "run small of acme"


def test_tag_budget_applies_to_calls_with_that_tag_only() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("50"), window="month")
    reserve_30(tags={"project": "alpha"})
    reserve_30(tags={"project": "beta"})
    reserve_30()
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(tags={"project": "alpha", "feature": "chat"})
    assert refused.value.scope == "tag project=alpha of acme"
    assert refused.value.remaining == D("20")


def test_tag_budgets_are_per_tenant() -> None:
    seed(limit="1000")
    seed(limit="1000", tenant="beta")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("10"), window="month")
    reserve_30(tenant="beta", tags={"project": "alpha"})  # acme's tag budget is not beta's


def test_refusal_takes_no_hold_anywhere_and_names_the_tightest() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("100"), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("40"), window="month")
    budgets.set_limit(tenant="acme", tag=("feature", "chat"), amount=D("35"), window="month")
    reserve_30(run="r", tags={"project": "alpha", "feature": "chat"})
    before = _reserved()
    assert len(before) == 4  # tenant, run r, two tags: one hold on each
    assert set(before.values()) == {D("30")}
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(run="r", tags={"project": "alpha", "feature": "chat"})
    # Both tags refuse; the one with the least room (5 < 10) is named.
    assert refused.value.scope == "tag feature=chat of acme"
    assert _reserved() == before
    assert Reservation.objects.count() == 1


def test_api_key_budget_applies_to_calls_made_with_that_key() -> None:
    seed(limit="1000")
    key, _ = api_key_create(tenant="acme", name="integration")
    other, _ = api_key_create(tenant="acme", name="other")
    budgets.set_limit(tenant="acme", api_key=key.prefix, amount=D("30"), window="day")
    reservation_create(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        api_key=key,
    )
    with pytest.raises(BudgetExceeded) as refused:
        reservation_create(
            tenant="acme",
            provider=FAKE_PROVIDER,
            model=FAKE_MODEL,
            input_tokens=0,
            max_output_tokens=1000,
            api_key=key,
        )
    assert refused.value.scope == f"API key {key.prefix}"
    # Another key, and the in-process API (no key), are not limited by it.
    reservation_create(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        api_key=other,
    )
    reserve_30()


def test_api_key_star_gives_each_key_its_own_counter() -> None:
    seed(limit="1000")
    first, _ = api_key_create(tenant="acme", name="a")
    second, _ = api_key_create(tenant="acme", name="b")
    budgets.set_limit(tenant="acme", api_key="*", amount=D("30"), window="day")
    call = {
        "tenant": "acme",
        "provider": FAKE_PROVIDER,
        "model": FAKE_MODEL,
        "input_tokens": 0,
        "max_output_tokens": 1000,
    }
    reservation_create(**call, api_key=first)
    reservation_create(**call, api_key=second)
    with pytest.raises(BudgetExceeded) as refused:
        reservation_create(**call, api_key=first)
    assert refused.value.scope == f"API key {first.prefix}"
    assert Counter.objects.filter(api_key__isnull=False).count() == 2


def test_close_run_refuses_later_reservations_and_is_audited() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("100"), window="lifetime")
    hold = reserve_30(run="run-42")
    closed = budgets.close_run(tenant="acme", run="run-42", actor="ops", reason="done")
    assert (closed.tenant, closed.run) == ("acme", "run-42")
    closed_at = closed.closed_at
    with pytest.raises(RunClosed) as refused:
        reserve_30(run="run-42")
    assert refused.value.run == "run-42"
    assert refused.value.closed_at == closed_at
    assert "Run run-42 of acme was closed" in refused.value.message
    # A hold taken before the close still settles.
    hold.commit(input_tokens=0, output_tokens=100)
    # Closing again changes nothing.
    assert budgets.close_run(tenant="acme", run="run-42").closed_at == closed_at
    assert AuditEvent.objects.filter(action="run.close").count() == 1
    # Other runs go on.
    reserve_30(run="run-43")


def test_closing_a_run_never_seen_closes_it_before_its_first_call() -> None:
    seed(limit="1000")
    budgets.close_run(tenant="acme", run="never")
    with pytest.raises(RunClosed):
        reserve_30(run="never")
    assert Run.objects.get(external_id="never").closed_at is not None


def test_a_run_named_star_is_refused_on_a_call() -> None:
    seed(limit="1000")
    with pytest.raises(InvalidUsage) as bad:
        reserve_30(run="*")
    assert bad.value.context["field"] == "run"


def test_set_limit_takes_one_scope_and_checks_it() -> None:
    seed(limit="1000")
    with pytest.raises(InvalidUsage, match="one scope"):
        budgets.set_limit(tenant="acme", run="*", tag=("a", "b"), amount=D("1"), window="lifetime")
    with pytest.raises(InvalidUsage, match="needs a tenant"):
        budgets.set_limit(run="*", amount=D("1"), window="lifetime")
    with pytest.raises(InvalidUsage, match="No API key"):
        budgets.set_limit(tenant="acme", api_key="nosuchkey", amount=D("1"), window="day")
    with pytest.raises(InvalidUsage, match="pair"):
        budgets.set_limit(tenant="acme", tag="project", amount=D("1"), window="day")  # type: ignore[arg-type]
    # Setting the same scope again changes its limit, not a second budget.
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("5"), window="day")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("7"), window="day")
    assert Budget.objects.get(scope=Scope.TAG).limit == D("7")


def test_status_quote_and_explain_name_the_scopes() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("100"), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=D("50"), window="month")
    reserve_30(run="run-42", tags={"project": "alpha"})
    labels = {
        s.scope_label: s.reserved
        for s in budgets.status(tenant="acme", run="run-42", tags={"project": "alpha"})
    }
    assert labels == {
        "tenant acme": D("30"),
        "run run-42 of acme": D("30"),
        "tag project=alpha of acme": D("30"),
    }
    # A run not seen yet shows the default at zero, and creates nothing.
    fresh = {s.scope_label: s.reserved for s in budgets.status(tenant="acme", run="new")}
    assert fresh["run new of acme"] == 0
    assert not Run.objects.filter(external_id="new").exists()
    quote = budgets.quote(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        run="run-42",
        tags={"project": "alpha"},
    )
    assert {d.status.scope_label for d in quote.budgets} == set(labels)
    explained = budgets.explain(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        tags={"project": "alpha"},
    )
    assert "tag project=alpha of acme" in {d.status.scope_label for d in explained.budgets}


def test_a_kill_switch_on_a_run_stops_only_that_run() -> None:
    seed(limit="1000")
    switch = budgets.trip(tenant="acme", run="run-42", reason="looping", actor="ops")
    assert switch.scope == "run run-42 of acme"
    with pytest.raises(KillSwitchActive) as refused:
        reserve_30(run="run-42", end_user="u-1")
    assert refused.value.scope == "run run-42 of acme"
    assert "looping" in refused.value.message
    reserve_30(run="run-43")
    reserve_30()
    with pytest.raises(InvalidUsage, match="run needs a tenant"):
        budgets.trip(run="run-42", reason="x")
    budgets.clear(tenant="acme", run="run-42", reason="fixed", actor="ops")
    reserve_30(run="run-42")


def test_sweep_void_and_raise_follow_run_and_tag_counters() -> None:
    """The sweep, a void and a temporary raise work on run and tag budgets as on any other:
    they follow the reservation's holds and the budget, whatever its scope."""
    seed(limit="1000")
    run_budget = budgets.set_limit(tenant="acme", run="*", amount=D("30"), window="lifetime")
    tag_budget = budgets.set_limit(
        tenant="acme", tag=("project", "alpha"), amount=D("1000"), window="month"
    )
    start = timezone.now()
    reserve_30_at(start - timedelta(hours=1), run="r", tags={"project": "alpha"}, ttl=60)
    assert budgets.sweep() == 1  # expired: charged as estimated on every counter it held
    run_counter = Counter.objects.get(budget_id=run_budget.id)
    tag_counter = Counter.objects.get(budget_id=tag_budget.id)
    assert (run_counter.spent, run_counter.reserved) == (D("30"), D("0"))
    assert (tag_counter.spent, tag_counter.reserved) == (D("30"), D("0"))
    assert UsageRecord.objects.get().run.external_id == "r"  # type: ignore[union-attr]
    with pytest.raises(BudgetExceeded):
        reserve_30(run="r")
    # A void gives a run its money back, on the run's and the tag's counters alike.
    committed = reserve_30(run="s", tags={"project": "alpha"})
    committed.commit(input_tokens=0, output_tokens=1000)
    line = UsageRecord.objects.get(reservation_id=committed.id)
    usage_void(record_id=line.pk, reason="provider refunded")
    assert UsageRecord.objects.get(voids=line).run_id == line.run_id
    tag_counter.refresh_from_db()
    assert tag_counter.spent == D("30")  # the expired hold's 30 only
    assert Counter.objects.get(budget_id=run_budget.id, run__external_id="s").spent == 0
    reserve_30(run="s")
    # A temporary raise on the run budget makes room for one more.
    with pytest.raises(BudgetExceeded):
        reserve_30(run="s")
    budget_raise_grant(
        budget=Budget.objects.get(pk=run_budget.id),
        amount=D("30"),
        until=timezone.now() + timedelta(hours=1),
        reason="support ticket",
    )
    reserve_30(run="s")
    assert counters_drift() == []


def test_an_agent_loop_is_stopped_by_its_run_budget() -> None:
    """docs/limits.md's worked example: a loop that never ends by itself is stopped by its
    run's lifetime budget, its last turn refused without a hold anywhere; other runs go on."""
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("2"), window="lifetime")

    def agent_loop() -> int:
        turns = 0
        while True:  # a loop that never ends by itself
            with reserve_30(run="run-7", max_output_tokens=10) as hold:  # holds 0.30
                hold.commit(input_tokens=0, output_tokens=8)  # costs 0.24
            turns += 1
            assert turns < 100, "the run budget never stopped the loop"
            done.append(turns)

    done: list[int] = []
    with pytest.raises(BudgetExceeded) as refused:
        agent_loop()
    turns = len(done)
    assert refused.value.scope == "run run-7 of acme"
    # 0.24 a turn against 2, each turn first holding 0.30: the eighth (1.68 + 0.30 <= 2) is
    # the last admitted; the ninth (1.92 + 0.30 > 2) is refused.
    assert turns == 8
    assert refused.value.remaining == D("2") - 8 * D("0.24")
    assert Reservation.objects.filter(state="held").count() == 0
    budgets.close_run(tenant="acme", run="run-7")
    with pytest.raises(RunClosed):
        reserve_30(run="run-7", max_output_tokens=10)
    reserve_30(run="run-8", max_output_tokens=10)


def test_a_runs_spend_can_be_reset_by_staff() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=D("60"), window="lifetime")
    for _ in range(2):
        reserve_30(run="r").commit(input_tokens=0, output_tokens=1000)
    with pytest.raises(BudgetExceeded):
        reserve_30(run="r")
    lines = run_spend_reset(tenant="acme", run="r", reason="ticket 7", actor="support")
    assert [line.cost for line in lines] == [D("-60")]
    assert lines[0].run is not None
    reserve_30(run="r")  # the run has its 60 again; the tenant's spend stands
    assert Counter.objects.get(budget__scope=Scope.TENANT).spent == D("60")
    assert AuditEvent.objects.filter(action="run.reset_spend").count() == 1
    assert counters_drift() == []
