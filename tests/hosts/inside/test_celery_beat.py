"""The host whose beat uses django-celery-beat's DatabaseScheduler (rows an operator edits)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
import time_machine
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler
from hostproj.celery import app

from llm_budgets.schedule import BEAT_SCHEDULE, JOBS, SWEEP_EXPIRED_HOLDS

SWEEP = SWEEP_EXPIRED_HOLDS.name


def beat_starts() -> None:
    """What ``celery beat`` does at start under this scheduler: it writes
    ``CELERY_BEAT_SCHEDULE``'s entries over the rows of the same name."""
    DatabaseScheduler(app=app)


@pytest.mark.django_db
def test_an_operators_edit_survives_beat_starting() -> None:
    call_command("llm_budgets_install_schedule", stdout=io.StringIO(), stderr=io.StringIO())
    row = PeriodicTask.objects.get(name=SWEEP)
    row.interval, _ = IntervalSchedule.objects.get_or_create(every=45, period="seconds")
    row.save()
    beat_starts()
    row.refresh_from_db()
    assert row.interval.every == 45
    assert row.expire_seconds == SWEEP_EXPIRED_HOLDS.every  # install_schedule's expiry is kept


@pytest.mark.django_db
def test_check_notices_the_dict_merged_under_the_database_scheduler() -> None:
    call_command("llm_budgets_install_schedule", stdout=io.StringIO(), stderr=io.StringIO())
    assert not [m.id for m in run_checks() if m.id.startswith("llm_budgets.W08")]
    with override_settings(CELERY_BEAT_SCHEDULE=dict(BEAT_SCHEDULE)):
        ids = [m.id for m in run_checks()]
    assert "llm_budgets.W080" in ids


@pytest.mark.django_db
def test_check_notices_no_job_scheduled() -> None:
    ids = [m.id for m in run_checks()]  # DatabaseScheduler, but install_schedule never run
    assert "llm_budgets.W082" in ids


@pytest.mark.django_db
def test_health_names_every_overdue_job() -> None:
    call_command("llm_budgets_install_schedule", stdout=io.StringIO(), stderr=io.StringIO())
    with time_machine.travel(timezone.now() + timedelta(hours=2)):
        response = Client().get("/api/llm-budgets/v1/health")
    assert response.status_code == 503
    detail = response.json()["checks"]["jobs"]["detail"]
    # Every job due more often than hourly, and no other (no Stripe key here).
    due = {job.task for job in JOBS if job.every < 3600 and job.needs != "stripe"}
    assert due
    for task in due:
        assert task in detail, detail
    assert "purge_retention" not in detail
