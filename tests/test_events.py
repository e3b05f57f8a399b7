"""Structured log lines (llm_budgets.events): one per refusal, trip, expiry and settlement error,
with the documented field names as LogRecord attributes."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.events import FIELDS
from llm_budgets.exceptions import (
    BudgetExceeded,
    KillSwitchActive,
    ReservationNotFound,
    UnknownTenant,
)
from llm_budgets.logformat import JsonFormatter
from tests.factories import reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="llm_budgets.events")
    return caplog


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def test_a_budget_refusal_logs_one_line_with_its_numbers(lines: pytest.LogCaptureFixture) -> None:
    seed(limit="50")
    reserve_30(end_user="u-1")
    with pytest.raises(BudgetExceeded):
        reserve_30(end_user="u-1")
    (line,) = events(lines, "admission.refused")
    assert line.levelno == logging.INFO
    assert (line.reason, line.tenant, line.end_user) == ("budget_exceeded", "acme", "u-1")
    assert (line.scope, line.scope_kind, line.window) == ("tenant acme", "tenant", "month")
    amounts = (line.limit, line.remaining, line.requested)
    assert tuple(map(Decimal, amounts)) == (50, 20, 30)
    assert line.currency == "USD"
    assert all(isinstance(a, str) for a in amounts)  # exact, never float
    assert line.retry_after >= 1
    assert "admission.refused reason=budget_exceeded" in line.getMessage()
    assert 'scope="tenant acme"' in line.getMessage()


def test_a_kill_switch_trip_a_refusal_and_a_clear_each_log_a_line(
    lines: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    seed()
    # The trip's line comes from the kill_switch_tripped signal, sent after commit.
    with django_capture_on_commit_callbacks(execute=True):
        switch = budgets.trip(tenant="acme", reason="runaway agent", actor="ops@example.com")
    with pytest.raises(KillSwitchActive):
        reserve_30()
    with django_capture_on_commit_callbacks(execute=True):
        budgets.clear(tenant="acme", reason="fixed", actor="ops@example.com")
    (tripped,) = events(lines, "kill_switch.tripped")
    assert (tripped.switch_id, tripped.scope_kind, tripped.tenant) == (switch.id, "tenant", "acme")
    assert (tripped.detail, tripped.actor, tripped.automatic) == (
        "runaway agent",
        "ops@example.com",
        False,
    )
    assert tripped.levelno == logging.WARNING
    (refused,) = events(lines, "admission.refused")
    assert (refused.reason, refused.switch_id) == ("kill_switch_active", switch.id)
    (cleared,) = events(lines, "kill_switch.cleared")
    assert cleared.detail == "fixed"


def test_other_refusals_log_their_code(lines: pytest.LogCaptureFixture) -> None:
    with pytest.raises(UnknownTenant):
        reserve_30(tenant="nobody")
    (line,) = events(lines, "admission.refused")
    assert (line.reason, line.tenant, line.scope_kind) == ("unknown_tenant", "nobody", "none")


def test_each_expired_hold_and_the_sweep_run_log_a_line(lines: pytest.LogCaptureFixture) -> None:
    seed()
    first = reserve_30_at(timezone.now() - timedelta(minutes=5))
    second = reserve_30_at(timezone.now() - timedelta(minutes=5))
    assert budgets.sweep() == 2
    expired = events(lines, "hold.expired")
    assert sorted(str(r.reservation_id) for r in expired) == sorted(
        [str(first.pk), str(second.pk)]  # type: ignore[attr-defined]
    )
    (run,) = events(lines, "sweep.finished")
    assert run.expired == 2


def test_a_settlement_error_logs_a_warning(lines: pytest.LogCaptureFixture) -> None:
    missing = uuid4()
    with pytest.raises(ReservationNotFound):
        budgets.commit(missing, input_tokens=1, output_tokens=1)
    (line,) = events(lines, "settlement.failed")
    assert line.levelno == logging.WARNING
    assert (line.action, line.reason) == ("commit", "reservation_not_found")
    assert str(line.reservation_id) == str(missing)


def test_an_admitted_call_logs_nothing(lines: pytest.LogCaptureFixture) -> None:
    seed()
    reserve_30().commit(input_tokens=0, output_tokens=10)
    assert events(lines, "admission.refused") == events(lines, "settlement.failed") == []


def test_the_json_formatter_writes_the_fields_as_top_level_keys(
    lines: pytest.LogCaptureFixture,
) -> None:
    seed(limit="10")
    with pytest.raises(BudgetExceeded):
        reserve_30()
    (line,) = events(lines, "admission.refused")
    data = json.loads(JsonFormatter().format(line))
    assert data["event"] == "admission.refused"
    assert data["level"] == "INFO"
    assert data["logger"] == "llm_budgets.events"
    assert Decimal(data["remaining"]) == 10
    assert set(data) - {"time", "level", "logger", "message"} <= set(FIELDS)
