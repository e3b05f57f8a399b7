"""Scheduling beside a host's scheduler (issue 23): one path per scheduler, a check that notices
both or neither, and ``/health`` naming every job that stopped running."""

from __future__ import annotations

import importlib.util
import io
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from llm_budgets.checks import DATABASE_SCHEDULER, check_schedule
from llm_budgets.health import health_check
from llm_budgets.jobs.records import job_finished
from llm_budgets.models import JobRun
from llm_budgets.schedule import BEAT_SCHEDULE, jobs_installed, periodic_tasks_install
from llm_budgets.tasks import sweep_expired_holds

SWEEP = "llm_budgets.sweep_expired_holds"
# django-celery-beat 2.9 caps Django < 6.1, so the Python 3.13 leg (Django 6.x) goes without it
# (pyproject.toml's dev extra); on 3.11 it is installed, and a test that needs it fails there.
needs_beat_rows = pytest.mark.skipif(
    importlib.util.find_spec("django_celery_beat") is None and sys.version_info >= (3, 12),
    reason="django-celery-beat is not installable beside Django 6.1 (the Python 3.13 leg)",
)


def _ids(**settings: object) -> list[str]:
    with override_settings(**settings):
        return [message.id for message in check_schedule()]


@pytest.mark.django_db
def test_the_ready_dict_merged_under_the_database_scheduler_is_a_warning() -> None:
    merged = {**BEAT_SCHEDULE, "host: own job": {"task": "host.job", "schedule": 5.0}}
    assert _ids(CELERY_BEAT_SCHEDULER=DATABASE_SCHEDULER, CELERY_BEAT_SCHEDULE=merged) == [
        "llm_budgets.W080"
    ]
    # Static beat with the ready dict: the documented path, nothing to say.
    assert (
        _ids(CELERY_BEAT_SCHEDULER="celery.beat:PersistentScheduler", CELERY_BEAT_SCHEDULE=merged)
        == []
    )


@pytest.mark.django_db
def test_celery_without_any_job_scheduled_is_a_warning_naming_them() -> None:
    with override_settings(
        CELERY_BEAT_SCHEDULER="celery.beat:PersistentScheduler",
        CELERY_BEAT_SCHEDULE={"host: own job": {"task": "host.job", "schedule": 5.0}},
    ):
        (warning,) = check_schedule()
    assert warning.id == "llm_budgets.W081"
    assert SWEEP in warning.msg
    assert "llm_budgets.stripe_push" not in warning.msg  # no Stripe key: nothing to push


@needs_beat_rows
@pytest.mark.django_db
def test_the_database_scheduler_without_the_rows_is_a_warning_until_installed() -> None:
    with override_settings(CELERY_BEAT_SCHEDULER=DATABASE_SCHEDULER):
        (warning,) = check_schedule()
        assert warning.id == "llm_budgets.W082"
        assert SWEEP in warning.msg
        periodic_tasks_install()
        assert check_schedule() == []


@needs_beat_rows
@pytest.mark.django_db
def test_install_schedule_warns_when_the_ready_dict_would_overwrite_its_rows() -> None:
    err = io.StringIO()
    with override_settings(
        CELERY_BEAT_SCHEDULER=DATABASE_SCHEDULER, CELERY_BEAT_SCHEDULE=BEAT_SCHEDULE
    ):
        call_command("llm_budgets_install_schedule", stdout=io.StringIO(), stderr=err)
    assert "CELERY_BEAT_SCHEDULE" in err.getvalue()
    assert "llm_budgets.W080" in err.getvalue()


@pytest.mark.django_db
def test_health_names_every_overdue_job() -> None:
    started = timezone.now()
    for job in jobs_installed():
        job_finished(job.task, now=started)
    # 400 s on: only the 10 s alert delivery and the 30 s sweep are past twice their interval
    # plus the 300 s slack.
    report = health_check(now=started + timedelta(seconds=400))
    (jobs,) = [check for check in report.checks if check.name == "jobs"]
    assert report.failing == ["jobs"]
    assert list(jobs.values) == ["llm_budgets.deliver_alerts", SWEEP]
    # 500 s on: the 60 s jobs too, each named.
    report = health_check(now=started + timedelta(seconds=500))
    (jobs,) = [check for check in report.checks if check.name == "jobs"]
    assert sorted(jobs.values) == [
        "llm_budgets.deliver_alerts",
        "llm_budgets.detect_anomalies",
        "llm_budgets.scan_thresholds",
        SWEEP,
    ]
    for task in jobs.values:
        assert task in jobs.detail


@pytest.mark.django_db
def test_a_task_and_a_command_record_that_their_job_finished() -> None:
    assert not JobRun.objects.exists()
    sweep_expired_holds()
    call_command("llm_budgets_warnings", stdout=io.StringIO())
    assert set(JobRun.objects.values_list("task", flat=True)) == {
        SWEEP,
        "llm_budgets.scan_thresholds",
    }
