"""Kill switches (issue 5, items 1, 2 and 6): scopes, refusals that explain themselves, audit,
signals, operator email, and a trip on one connection refusing the next admission on another."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.db import connection
from django.db.models.signals import pre_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control import killswitches
from llm_budgets.exceptions import (
    BudgetExceeded,
    InvalidUsage,
    KillSwitchActive,
    LedgerUnavailable,
)
from llm_budgets.models import AuditEvent, KillSwitch, Refusal, RefusalKind, Reservation
from llm_budgets.signals import kill_switch_cleared, kill_switch_tripped
from tests.concurrency import run_threads
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed
from tests.queries import reads

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> None:
    seed(limit="1000")
    seed(limit="1000", tenant="globex")


def test_a_global_trip_refuses_everyone_and_names_switch_reason_and_who() -> None:
    seed()
    switch = budgets.trip(reason="bad deploy of the agent", actor="alice")
    with pytest.raises(KillSwitchActive) as refused:
        reserve_30()
    error = refused.value
    assert (error.switch_id, error.scope, error.reason) == (
        switch.id,
        "global",
        "bad deploy of the agent",
    )
    assert error.tripped_by == "alice"
    assert error.tripped_at == switch.tripped_at
    assert "bad deploy of the agent" in str(error)
    assert "alice" in str(error)
    assert Reservation.objects.count() == 0


@pytest.mark.parametrize(
    ("scope", "refused", "admitted"),
    [
        ({"tenant": "acme"}, [("acme", None)], [("globex", None)]),
        (
            {"tenant": "acme", "end_user": "u-1"},
            [("acme", "u-1")],
            [("acme", "u-2"), ("acme", None)],
        ),
        ({"provider": FAKE_PROVIDER}, [("acme", None), ("globex", "u-1")], []),
        ({"provider": "other"}, [], [("acme", None)]),
        ({"model": FAKE_MODEL, "tenant": "globex"}, [("globex", "u-1")], [("acme", "u-1")]),
        ({"model": "another-model"}, [], [("acme", "u-1")]),
    ],
)
def test_a_scope_covers_exactly_its_intersection(
    acme: None,
    scope: dict[str, str],
    refused: list[tuple[str, str | None]],
    admitted: list[tuple[str, str | None]],
) -> None:
    budgets.trip(reason="test", **scope)
    for tenant, end_user in refused:
        with pytest.raises(KillSwitchActive):
            reserve_30(tenant=tenant, end_user=end_user)
    for tenant, end_user in admitted:
        reserve_30(tenant=tenant, end_user=end_user).release()


def test_clear_reopens_admission_and_both_are_audited(acme: None) -> None:
    budgets.trip(tenant="acme", model=FAKE_MODEL, reason="loop in agent v2", actor="alice")
    with pytest.raises(KillSwitchActive):
        reserve_30()
    cleared = budgets.clear(tenant="acme", model=FAKE_MODEL, reason="v2 rolled back", actor="bob")
    reserve_30().release()
    assert cleared.cleared_by == "bob"
    assert cleared.clear_reason == "v2 rolled back"
    trip, clear = AuditEvent.objects.filter(action__startswith="kill_switch").order_by("pk")
    assert (trip.action, trip.actor, trip.reason) == (
        "kill_switch.trip",
        "alice",
        "loop in agent v2",
    )
    assert trip.after is not None
    assert trip.after["scope"] == f"tenant acme, model {FAKE_MODEL}"
    assert trip.tenant is not None
    assert trip.tenant.external_id == "acme"
    assert (clear.action, clear.actor, clear.reason) == (
        "kill_switch.clear",
        "bob",
        "v2 rolled back",
    )
    assert clear.before is not None
    assert clear.before["reason"] == "loop in agent v2"


def test_clear_needs_the_exact_scope_and_a_reason(acme: None) -> None:
    budgets.trip(tenant="acme", model=FAKE_MODEL, reason="x")
    with pytest.raises(InvalidUsage) as wrong_scope:
        budgets.clear(tenant="acme", reason="wrong scope")
    assert wrong_scope.value.field == "scope"
    with pytest.raises(InvalidUsage) as unseen:
        budgets.clear(tenant="acme", end_user="never-seen", reason="no such user")
    assert unseen.value.field == "scope"
    with pytest.raises(InvalidUsage) as no_reason:
        budgets.clear(tenant="acme", model=FAKE_MODEL, reason="  ")
    assert no_reason.value.field == "reason"
    with pytest.raises(InvalidUsage) as trip_no_reason:
        budgets.trip(tenant="acme", reason="")
    assert trip_no_reason.value.field == "reason"
    with pytest.raises(TypeError, match="reason"):  # required: no default to refuse
        budgets.trip(tenant="acme")  # type: ignore[call-arg]
    with pytest.raises(InvalidUsage) as orphan:
        budgets.trip(end_user="u-1", reason="x")
    assert orphan.value.field == "tenant"


def test_tripping_a_tripped_scope_keeps_the_first_switch(acme: None) -> None:
    first = budgets.trip(tenant="acme", reason="first")
    again = budgets.trip(tenant="acme", reason="second")
    assert again.id == first.id
    assert again.reason == "first"
    assert KillSwitch.objects.count() == 1


@contextmanager
def _rivals(times: int) -> Iterator[list[bool]]:
    """Another trip of the same scope wins this trip's insert ``times`` times, and a clear closes
    each winner's switch before this trip reads it again: the rival's switch is inserted in this
    trip's transaction just before its own insert (``pre_save``), so that insert fails and the
    rollback takes the rival's switch too. Yields, for each insert tried, whether a rival won."""
    tried: list[bool] = []

    def rival_first(sender: Any, instance: KillSwitch, **kwargs: Any) -> None:
        if instance.pk is not None:  # a clear saving an open switch
            return
        rival = len(tried) < times
        tried.append(rival)
        if rival:  # bulk_create sends no pre_save: no recursion
            KillSwitch.objects.bulk_create(
                [
                    KillSwitch(
                        tenant=instance.tenant,
                        end_user=instance.end_user,
                        scope_key=instance.scope_key,
                        reason="a rival's trip",
                        tripped_at=instance.tripped_at,
                    )
                ]
            )

    pre_save.connect(rival_first, sender=KillSwitch, weak=False, dispatch_uid="rival_first")
    try:
        yield tried
    finally:
        pre_save.disconnect(sender=KillSwitch, dispatch_uid="rival_first")


def test_a_trip_whose_rival_was_cleared_meanwhile_trips_the_scope_anew(acme: None) -> None:
    """Found by the 10^6 soak (once): the rival's switch gone, the scope is free, so the trip
    trips it again instead of letting the database's IntegrityError out."""
    with _rivals(1) as tried:
        switch = budgets.trip(tenant="acme", end_user="u1", reason="ours", actor="alice")
    assert tried == [True, False]  # lost the insert, found none open, tripped anew
    assert (switch.active, switch.reason, switch.tripped_by) == (True, "ours", "alice")
    assert list(KillSwitch.objects.values_list("reason", flat=True)) == ["ours"]
    assert AuditEvent.objects.filter(action="kill_switch.trip").count() == 1


def test_a_trip_that_keeps_losing_to_rivals_is_ledger_unavailable_and_changes_nothing(
    acme: None,
) -> None:
    attempts = killswitches.TRIP_ATTEMPTS
    with (
        _rivals(attempts) as tried,
        pytest.raises(LedgerUnavailable, match=r"changed nothing\. Retry it"),
    ):
        budgets.trip(tenant="acme", end_user="u1", reason="ours")
    assert tried == [True] * attempts
    assert not KillSwitch.objects.exists()
    assert not AuditEvent.objects.filter(action="kill_switch.trip").exists()


def test_an_auto_clear_at_reopens_only_when_the_switch_says_so(acme: None) -> None:
    later = timezone.now() + timedelta(hours=1)
    budgets.trip(tenant="acme", reason="cool down", auto_clear_at=later)
    with pytest.raises(KillSwitchActive):
        reserve_30()
    from llm_budgets.engine.admission import reservation_create

    reservation_create(
        tenant="acme",
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=10,
        now=later + timedelta(seconds=1),
    )


def test_signals_and_operator_email_are_sent_after_commit(
    acme: None, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.LLM_BUDGETS = {"OPERATOR_EMAILS": ["ops@example.com"]}
    received: list[tuple[str, KillSwitch]] = []

    def on_trip(sender: Any, switch: KillSwitch, **kwargs: Any) -> None:
        received.append(("tripped", switch))

    def on_clear(sender: Any, switch: KillSwitch, **kwargs: Any) -> None:
        received.append(("cleared", switch))

    kill_switch_tripped.connect(on_trip)
    kill_switch_cleared.connect(on_clear)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            budgets.trip(tenant="acme", reason="attack", actor="alice")
        assert received == []  # nothing before commit
        for callback in callbacks:
            callback()
        with django_capture_on_commit_callbacks(execute=True):
            budgets.clear(tenant="acme", reason="blocked upstream", actor="bob")
    finally:
        kill_switch_tripped.disconnect(on_trip)
        kill_switch_cleared.disconnect(on_clear)
    assert [kind for kind, _ in received] == ["tripped", "cleared"]
    assert [m.to for m in mail.outbox] == [["ops@example.com"], ["ops@example.com"]]
    assert "tenant acme" in mail.outbox[0].subject
    assert "attack" in mail.outbox[0].body
    assert "cleared" in mail.outbox[1].subject.lower()
    assert "bob" in mail.outbox[1].body


def test_a_failing_email_does_not_undo_the_trip(
    acme: None, settings: Any, django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    settings.LLM_BUDGETS = {"OPERATOR_EMAILS": ["ops@example.com"]}

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("smtp down")

    monkeypatch.setattr("llm_budgets.control.killswitches.send_mail", broken)
    with django_capture_on_commit_callbacks(execute=True):
        budgets.trip(tenant="acme", reason="attack")
    with pytest.raises(KillSwitchActive):
        reserve_30()


def test_operator_emails_setting_is_checked(settings: Any) -> None:
    from llm_budgets.checks import check_settings

    settings.LLM_BUDGETS = {"OPERATOR_EMAILS": "ops@example.com"}
    assert [e.id for e in check_settings()] == ["llm_budgets.E040"]
    settings.LLM_BUDGETS = {"OPERATOR_EMAILS": ["ops@example.com"]}
    assert check_settings() == []


def test_refusals_are_recorded_with_budget_or_switch(acme: None) -> None:
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="day")
    reserve_30(end_user="u-1")
    with pytest.raises(BudgetExceeded):
        reserve_30(end_user="u-1")
    budgets.trip(tenant="acme", reason="attack", actor="alice")
    with pytest.raises(KillSwitchActive):
        reserve_30(end_user="u-1")
    switched, exceeded = Refusal.objects.order_by("-pk")
    assert exceeded.kind == RefusalKind.BUDGET
    assert exceeded.tenant is not None
    assert exceeded.tenant.external_id == "acme"
    assert exceeded.end_user is not None
    assert exceeded.end_user.external_id == "u-1"
    assert (exceeded.model, exceeded.requested, exceeded.remaining) == (
        FAKE_MODEL,
        Decimal(30),
        Decimal(20),
    )
    assert exceeded.budget is not None
    assert exceeded.budget.window == "day"
    assert exceeded.detail == "end user acme/u-1 day budget, limit 50.00 USD"
    assert switched.kind == RefusalKind.KILL_SWITCH
    assert switched.kill_switch is not None
    assert switched.detail.endswith("attack")


def test_a_failure_to_record_a_refusal_never_admits(acme: None, monkeypatch: Any) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr("llm_budgets.models.Refusal.save", broken)
    budgets.trip(tenant="acme", reason="attack")
    with pytest.raises(KillSwitchActive):
        reserve_30()
    assert Reservation.objects.count() == 0


def test_the_switch_check_costs_one_query_per_admission(acme: None) -> None:
    reserve_30().release()  # counters exist now
    with CaptureQueriesContext(connection) as queries:
        reserve_30()
    switch_reads = [q for q in queries.captured_queries if reads(q["sql"], KillSwitch)]
    assert len(switch_reads) == 1


def test_explain_lists_every_budget_and_switch_without_holding(acme: None) -> None:
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("20"), window="day")
    budgets.trip(tenant="acme", model=FAKE_MODEL, reason="loop", actor="alice")
    before = (Reservation.objects.count(), Refusal.objects.count())
    explanation = budgets.explain(
        tenant="acme", end_user="new-user", model=FAKE_MODEL, input_tokens=0, max_output_tokens=1000
    )
    assert explanation.amount == Decimal(30)
    assert {(b.status.scope_label, b.fits) for b in explanation.budgets} == {
        ("tenant acme", True),
        ("end user acme/*", False),
    }
    assert [(s.scope, s.reason, s.tripped_by) for s in explanation.switches] == [
        (f"tenant acme, model {FAKE_MODEL}", "loop", "alice")
    ]
    assert not explanation.would_admit
    assert (Reservation.objects.count(), Refusal.objects.count()) == before
    assert not budgets.status(tenant="acme", end_user="new-user")[0].spent


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_a_trip_on_one_connection_refuses_the_next_admission_on_another() -> None:
    seed(limit="100000")
    tripped = threading.Event()
    admitted_after_trip: list[object] = []

    def work(index: int) -> str:
        if index == 0:
            budgets.trip(tenant="acme", reason="attack", actor="alice")
            tripped.set()
            return "tripped"
        # Admit until the trip lands; after it, the very next admission must be refused.
        for _ in range(2000):
            seen_trip = tripped.is_set()
            try:
                reserve_30().release()
            except KillSwitchActive:
                return "refused"
            if seen_trip:
                admitted_after_trip.append(index)
        return "never refused"

    results = run_threads(4, work)
    assert results == ["tripped", "refused", "refused", "refused"]
    assert admitted_after_trip == []


def test_old_refusal_records_are_pruned_by_command(acme: None) -> None:
    from io import StringIO

    from django.core.management import call_command

    budgets.trip(tenant="acme", reason="attack")
    for _ in range(2):
        with pytest.raises(KillSwitchActive):
            reserve_30()
    Refusal.objects.filter(pk=Refusal.objects.first().pk).update(  # type: ignore[union-attr]
        created_at=timezone.now() - timedelta(days=91)
    )
    out = StringIO()
    call_command("llm_budgets_prune_refusals", stdout=out)
    assert "Deleted 1 refusal record(s)" in out.getvalue()
    assert Refusal.objects.count() == 1


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_a_trip_in_one_process_refuses_the_next_admission_in_every_other() -> None:
    import multiprocessing

    from tests.concurrency import run_processes

    seed(limit="100000")
    tripped = multiprocessing.get_context("fork").Event()

    def work(index: int) -> str:
        if index == 0:
            budgets.trip(tenant="acme", reason="attack", actor="alice")
            tripped.set()
            return "tripped"
        for _ in range(2000):
            seen_trip = tripped.is_set()
            try:
                reserve_30().release()
            except KillSwitchActive:
                return "refused"
            if seen_trip:
                return "admitted after the trip"
        return "never refused"

    results = run_processes(3, work)
    assert results == [("ok", "tripped"), ("ok", "refused"), ("ok", "refused")]
