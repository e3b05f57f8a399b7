"""Automatic trips (issue 5, item 3): detectors with per-plan thresholds; an automatic trip is
cleared only by a person and never re-opened by a timer unless the switch says so."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.engine.admission import reservation_create
from llm_budgets.exceptions import KillSwitchActive
from llm_budgets.jobs.anomalies import FAILURES, RUNAWAY, VELOCITY, anomalies_detect
from llm_budgets.models import AuditEvent, KillSwitch, Plan
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed

pytestmark = pytest.mark.django_db


def _plan(**thresholds: object) -> None:
    seed(limit="100000")
    Plan.objects.create(name="guarded", **thresholds)
    budgets.ensure_tenant(tenant="acme", plan="guarded")


def _reserve_at(when: object, end_user: str = "u-1") -> None:
    reservation_create(
        tenant="acme",
        end_user=end_user,
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1,
        now=when,  # type: ignore[arg-type]
    )


def test_a_runaway_loop_trips_that_end_user_and_only_a_person_clears_it() -> None:
    _plan(anomaly_reservations_per_minute=5)
    now = timezone.now()
    for i in range(6):  # the simulated loop: six reservations within the last minute
        _reserve_at(now - timedelta(seconds=50 - i))
    _reserve_at(now - timedelta(minutes=5), end_user="u-2")
    (switch,) = anomalies_detect(now=now)
    assert (switch.automatic, switch.detector, switch.auto_clear_at) == (True, RUNAWAY, None)
    assert switch.end_user is not None
    assert switch.end_user.external_id == "u-1"
    assert "6 reservations in the last minute" in switch.reason
    with pytest.raises(KillSwitchActive) as refused:
        reserve_30(end_user="u-1")
    assert refused.value.automatic
    assert refused.value.scope == "end user acme/u-1"
    reserve_30(end_user="u-2").release()  # only the looping user is stopped
    assert AuditEvent.objects.get(action="kill_switch.trip").actor == "detector:runaway_loop"

    assert anomalies_detect(now=now) == []  # already tripped: no second switch
    # No timer reopens it: a day later it still refuses.
    with pytest.raises(KillSwitchActive):
        _reserve_at(now + timedelta(days=1))
    budgets.clear(tenant="acme", end_user="u-1", reason="customer fixed the agent", actor="dan")
    assert anomalies_detect(now=now + timedelta(seconds=1)) == []  # the clear holds a window
    reserve_30(end_user="u-1").release()


def test_a_plan_can_let_automatic_trips_clear_themselves() -> None:
    _plan(anomaly_reservations_per_minute=2, anomaly_auto_clear_minutes=30)
    now = timezone.now()
    for i in range(3):
        _reserve_at(now - timedelta(seconds=10 + i))
    (switch,) = anomalies_detect(now=now)
    assert switch.auto_clear_at == now + timedelta(minutes=30)
    _reserve_at(now + timedelta(minutes=31))


def test_spend_velocity_trips_the_tenant() -> None:
    _plan(anomaly_tenant_spend=Decimal("50"), anomaly_window_minutes=10)
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    assert anomalies_detect() == []  # 30 in the window
    reserve_30(end_user="u-2")  # held: 60
    (switch,) = anomalies_detect()
    assert (switch.detector, switch.end_user_id) == (VELOCITY, None)
    assert switch.tenant is not None
    assert switch.tenant.external_id == "acme"
    assert "spent 60.00" in switch.reason


def test_spend_velocity_per_end_user() -> None:
    _plan(anomaly_end_user_spend=Decimal("40"))
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    reserve_30(end_user="u-2").commit(input_tokens=0, output_tokens=1000)
    assert anomalies_detect() == []
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    (switch,) = anomalies_detect()
    assert switch.end_user is not None
    assert switch.end_user.external_id == "u-1"


def test_a_failure_storm_trips_the_tenant() -> None:
    _plan(anomaly_failure_share=Decimal("0.5"), anomaly_failure_min_holds=4)
    for _ in range(2):
        reserve_30().commit(input_tokens=0, output_tokens=10)
    for _ in range(2):
        reserve_30().release()
    assert anomalies_detect() == []  # exactly half: not above
    reserve_30().release()
    (switch,) = anomalies_detect()
    assert switch.detector == FAILURES
    assert "3 of 5" in switch.reason


def test_a_plan_without_thresholds_never_trips() -> None:
    seed(limit="100000")
    for _ in range(10):
        reserve_30(end_user="u-1").release()
    assert anomalies_detect() == []


def test_the_management_command_reports_trips() -> None:
    _plan(anomaly_reservations_per_minute=1)
    reserve_30(end_user="u-1").release()
    reserve_30(end_user="u-1").release()
    out = StringIO()
    call_command("llm_budgets_detect_anomalies", stdout=out)
    assert "1 kill switch(es) tripped" in out.getvalue()
    assert KillSwitch.objects.filter(automatic=True).count() == 1


def test_the_scheduled_task_trips_a_runaway_loop() -> None:
    from llm_budgets.schedule import DETECT_ANOMALIES
    from llm_budgets.tasks import detect_anomalies

    _plan(anomaly_reservations_per_minute=5)
    now = timezone.now()
    for i in range(6):
        _reserve_at(now - timedelta(seconds=30 - i))
    assert detect_anomalies.delay().get() == 1
    assert KillSwitch.objects.get().detector == RUNAWAY
    assert (DETECT_ANOMALIES.task, DETECT_ANOMALIES.every) == ("llm_budgets.detect_anomalies", 60)


def test_uncertain_holds_count_towards_a_failure_storm() -> None:
    _plan(anomaly_failure_share=Decimal("0.5"), anomaly_failure_min_holds=4)
    reserve_30().commit(input_tokens=0, output_tokens=10)
    for _ in range(3):
        reserve_30().mark_uncertain()  # timeouts: still held, but a sign of trouble
    (switch,) = anomalies_detect()
    assert switch.detector == FAILURES
    assert "3 of 4" in switch.reason
