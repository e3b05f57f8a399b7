"""``GET /api/llm-budgets/v1/health``: no key, nothing tenant-specific, 503 naming what fails."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from llm_budgets import budgets, health
from llm_budgets.clock import when
from llm_budgets.conf import SettingError
from llm_budgets.jobs import records
from llm_budgets.jobs.records import job_finished
from llm_budgets.models import JobRun
from llm_budgets.schedule import PURGE_RETENTION, jobs_installed
from llm_budgets.tasks import purge_retention
from tests.api import BASE
from tests.factories import reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db

URL = f"{BASE}health"
PURGE = PURGE_RETENTION.task
# A retention setting its reader refuses: the purge job really raises, as a task and a command.
BROKEN_PURGE = {"RETENTION_RELEASED_DAYS": 0}


@pytest.fixture(autouse=True)
def jobs_ran() -> None:
    """Every job has just finished (the ``jobs`` check: tests/test_host_schedule.py)."""
    for job in jobs_installed():
        job_finished(job.task)


def get() -> tuple[int, dict]:
    response = APIClient().get(URL)
    return response.status_code, json.loads(response.content)


def test_a_healthy_installation_answers_200_without_a_key() -> None:
    seed()
    reserve_30()
    status, body = get()
    assert status == 200
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert set(body["checks"]) == {"database", "migrations", "sweep", "jobs"}
    assert all(check["ok"] for check in body["checks"].values())
    assert body["checks"]["database"]["values"]["bound_seconds"] == 3


def test_nothing_tenant_specific_is_in_it() -> None:
    seed(tenant="acme-secret-corp")
    hold = reserve_30(tenant="acme-secret-corp", end_user="alice@example.com")
    _, body = get()
    text = json.dumps({name: check["detail"] for name, check in body["checks"].items()})
    for private in ("acme", "alice", str(hold.id)):
        assert private not in json.dumps(body)
    assert "30" not in text  # the hold's amount
    assert {key for check in body["checks"].values() for key in check["values"]} <= {
        "seconds",
        "bound_seconds",
        "lag_seconds",
        "max_lag_seconds",
        "unapplied",
        *(job.task for job in jobs_installed()),  # the jobs check: each overdue job's age
    }


@override_settings(LLM_BUDGETS={"HEALTH_SWEEP_MAX_LAG_SECONDS": 60})
def test_a_hold_overdue_past_the_bound_fails_the_sweep_check_until_swept() -> None:
    seed()
    reserve_30_at(timezone.now() - timedelta(minutes=10), ttl=60)  # overdue by 9 minutes
    status, body = get()
    assert status == 503
    assert body["failing"] == ["sweep"]
    assert "sweep" in body["checks"]["sweep"]["detail"]
    assert body["checks"]["sweep"]["values"]["lag_seconds"] >= 539
    assert body["checks"]["database"]["ok"]
    assert body["checks"]["migrations"]["ok"]

    assert budgets.sweep() == 1
    assert get()[0] == 200


@override_settings(LLM_BUDGETS={"HEALTH_SWEEP_MAX_LAG_SECONDS": 60})
def test_a_hold_overdue_within_the_bound_is_fine() -> None:
    seed()
    reserve_30_at(timezone.now() - timedelta(seconds=90), ttl=60)  # overdue by 30 s
    assert get()[0] == 200


def test_unapplied_migrations_fail_the_migrations_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_migrations_applied", False)
    with mock.patch(
        "django.db.migrations.executor.MigrationExecutor.migration_plan",
        return_value=[("migration", False)],
    ):
        status, body = get()
    assert status == 503
    assert body["failing"] == ["migrations"]
    assert "manage.py migrate" in body["checks"]["migrations"]["detail"]


def test_a_database_that_fails_fails_every_check_that_needs_it() -> None:
    with mock.patch(
        "django.db.models.query.QuerySet.first", side_effect=OperationalError("server closed")
    ):
        status, body = get()
    assert status == 503
    assert body["failing"] == ["database", "migrations", "sweep", "jobs"]
    assert "could not be read within 3 s" in body["checks"]["database"]["detail"]


def test_a_database_slower_than_the_lock_timeout_bound_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([100.0, 104.5])
    monkeypatch.setattr(health.time, "perf_counter", lambda: next(clock))
    status, body = get()
    assert status == 503
    assert body["failing"] == ["database"]
    assert body["checks"]["database"]["values"]["seconds"] == 4.5


def test_a_job_whose_runs_fail_fails_the_jobs_check_until_a_run_finishes() -> None:
    with override_settings(LLM_BUDGETS=BROKEN_PURGE), pytest.raises(SettingError):
        purge_retention()  # the Celery task, run in process
    status, body = get()
    assert status == 503
    assert body["failing"] == ["jobs"]
    run = JobRun.objects.get(task=PURGE)
    jobs = body["checks"]["jobs"]
    assert jobs["detail"].startswith(
        f"failing: {PURGE} (llm_budgets.conf.SettingError at "
        f"{when(run.failed_at, None, seconds=True)}); "
    )
    assert "RETENTION" not in jobs["detail"]  # the class, never the message
    assert list(jobs["values"]) == [PURGE]  # not overdue: it finished a moment before

    # The command fails the same way; a run that finishes clears it.
    with override_settings(LLM_BUDGETS=BROKEN_PURGE), pytest.raises(SettingError):
        call_command("llm_budgets_purge", stdout=io.StringIO())
    assert get()[0] == 503
    call_command("llm_budgets_purge", stdout=io.StringIO())
    status, body = get()
    assert status == 200
    assert body["checks"]["jobs"]["values"] == {}
    run.refresh_from_db()
    assert (run.failed_at, run.error) == (None, "")


def test_a_job_that_only_ever_failed_is_named_failing_and_overdue() -> None:
    JobRun.objects.all().delete()
    installed = health._app_installed_at()
    assert installed is not None
    with override_settings(LLM_BUDGETS=BROKEN_PURGE), pytest.raises(SettingError):
        purge_retention()
    for job in jobs_installed():
        if job.task != PURGE:
            job_finished(job.task, now=installed + timedelta(days=3))
    report = health.health_check(now=installed + timedelta(days=3))
    (jobs,) = [check for check in report.checks if check.name == "jobs"]
    assert report.failing == ["jobs"]
    assert f"failing: {PURGE} (llm_budgets.conf.SettingError at " in jobs.detail
    assert f"overdue: {PURGE} (259200 s)" in jobs.detail  # counted from the installation
    assert jobs.values == {PURGE: 259200.0}


def test_a_failure_that_cannot_be_recorded_still_raises_the_jobs_own_error() -> None:
    with (
        mock.patch.object(records, "job_failed", side_effect=OperationalError("server closed")),
        override_settings(LLM_BUDGETS=BROKEN_PURGE),
        pytest.raises(SettingError),
    ):
        purge_retention()


def test_it_is_in_the_schema_without_security() -> None:
    schema = json.loads(APIClient().get(f"{BASE}schema/?format=json").content)
    operation = schema["paths"]["/api/llm-budgets/v1/health"]["get"]
    assert "security" not in schema  # no global requirement to inherit
    assert operation.get("security", []) in ([], [{}])
    reserve = schema["paths"]["/api/llm-budgets/v1/reservations"]["post"]
    assert reserve["security"] == [{"ApiKey": []}]
    assert set(operation["responses"]) == {"200", "503"}
