"""Celery wiring: every scheduled task exists and calls its service (run eagerly here); the
schedule is offered as a dict and as django-celery-beat rows."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from llm_budgets import tasks
from llm_budgets.engine.settlement import reservation_mark_uncertain
from llm_budgets.models import Reservation, ReservationState
from llm_budgets.schedule import BEAT_SCHEDULE, JOBS, periodic_tasks_install
from project import celery_app
from tests.factories import price_fake, reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db


def test_every_scheduled_task_is_registered() -> None:
    registered = set(celery_app.tasks)
    assert {entry["task"] for entry in BEAT_SCHEDULE.values()} <= registered
    assert BEAT_SCHEDULE["llm_budgets: expire overdue holds"]["schedule"] == 30.0


def test_the_sweep_task_expires_overdue_holds() -> None:
    price_fake(effective_from=timezone.now() - timedelta(days=1))
    seed()
    reserve_30_at(timezone.now() - timedelta(seconds=10), ttl=1)
    assert tasks.sweep_expired_holds.delay().get() == 1
    assert Reservation.objects.get().state == ReservationState.EXPIRED


def test_the_reconcile_task_settles_old_uncertain_holds() -> None:
    seed()
    hold = reserve_30()
    reservation_mark_uncertain(hold.id, now=timezone.now() - timedelta(days=1))
    assert tasks.reconcile_uncertain.delay().get() == 1
    assert Reservation.objects.get().state == ReservationState.COMMITTED


def test_the_housekeeping_tasks_run() -> None:
    seed()
    reserve_30().commit(input_tokens=0, output_tokens=10)
    assert tasks.rollup_daily_usage.delay().get() == 1
    assert tasks.purge_retention.delay().get() == 0


def test_the_schedule_installs_as_editable_rows_once() -> None:
    # Not installable beside Django 6.1 (see pyproject.toml); the Django 5.2 leg runs this.
    pytest.importorskip("django_celery_beat")
    from django_celery_beat.models import PeriodicTask

    assert sorted(periodic_tasks_install()) == sorted(job.name for job in JOBS)
    PeriodicTask.objects.filter(task="llm_budgets.sweep_expired_holds").update(enabled=False)
    out = StringIO()
    call_command("llm_budgets_install_schedule", stdout=out)
    assert "Created 0" in out.getvalue()
    # An operator's edit survives a re-install.
    assert not PeriodicTask.objects.get(task="llm_budgets.sweep_expired_holds").enabled
