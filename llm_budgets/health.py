"""Whether this installation can admit calls right now, for load balancers and uptime checks.

Three checks, each cheap and none tenant-specific:

- ``database``: the ledger's tables answer a read within ``LOCK_TIMEOUT_SECONDS`` (the bound
  admission itself waits for a lock), so a database that would make admission fail closed fails
  here first.
- ``migrations``: every migration of every installed app is applied. Once true it stays true for
  the process (a deploy that adds migrations starts new processes).
- ``sweep``: no held reservation is overdue by more than ``HEALTH_SWEEP_MAX_LAG_SECONDS``. An
  overdue hold still counts against its budgets until the sweep expires it, so a sweep that has
  stopped shows as lag, whenever it last ran (with nothing overdue there is nothing to sweep).
- ``jobs``: every job of the installed apps (``schedule.jobs_installed``; those that need Stripe
  only with a Stripe key) has finished, as a task or a command, within twice its default
  interval plus ``HEALTH_SWEEP_MAX_LAG_SECONDS``; a job never recorded counts from when the app
  was installed (its first migration). The detail names every overdue job: a schedule that lost
  some jobs (a scheduler that never got them, cron lines left out) shows here. A job whose last
  run raised fails the check at once, named with its error's class and when, until one of its
  runs finishes (``jobs/records.py``): a job that runs on time and fails every time is not
  keeping up either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from llm_budgets.clock import when
from llm_budgets.conf import conf
from llm_budgets.models import Counter, JobRun, Reservation, ReservationState
from llm_budgets.schedule import jobs_expected


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    values: dict[str, Any] = field(default_factory=dict)
    reachable: bool = True  # False: the database did not answer, so later checks cannot run


@dataclass(frozen=True)
class HealthReport:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]


_migrations_applied = False


def health_check(*, now: datetime | None = None) -> HealthReport:
    """Run every check; a database that is down fails ``database`` and the checks that need it."""
    now = now or timezone.now()
    database = _database()
    if not database.reachable:
        skipped = "not checked: the database is unavailable"
        return HealthReport(
            [database, *(Check(name, False, skipped) for name in ("migrations", "sweep", "jobs"))]
        )
    return HealthReport([database, _migrations(), _sweep(now), _jobs(now)])


def _database() -> Check:
    bound = float(conf.LOCK_TIMEOUT_SECONDS)
    started = time.perf_counter()
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('statement_timeout', %s, true)",
                        [f"{int(bound * 1000)}ms"],
                    )
            Counter.objects.values_list("pk").first()
    except DatabaseError as exc:
        return Check(
            "database",
            False,
            f"the ledger could not be read within {bound:g} s ({type(exc).__name__})",
            {"seconds": round(time.perf_counter() - started, 4), "bound_seconds": bound},
            reachable=False,
        )
    seconds = time.perf_counter() - started
    ok = seconds <= bound
    detail = "the ledger answers" if ok else f"the ledger answered after the {bound:g} s bound"
    return Check("database", ok, detail, {"seconds": round(seconds, 4), "bound_seconds": bound})


def _migrations() -> Check:
    global _migrations_applied
    if not _migrations_applied:
        try:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except DatabaseError as exc:
            return Check("migrations", False, f"could not be read ({type(exc).__name__})")
        if plan:
            return Check(
                "migrations",
                False,
                f"{len(plan)} migration(s) not applied: run manage.py migrate",
                {"unapplied": len(plan)},
            )
        _migrations_applied = True
    return Check("migrations", True, "all applied")


def _sweep(now: datetime) -> Check:
    max_lag = conf.HEALTH_SWEEP_MAX_LAG_SECONDS
    try:
        oldest = (
            Reservation.objects.filter(state=ReservationState.HELD, expires_at__lte=now)
            .order_by("expires_at")
            .values_list("expires_at", flat=True)
            .first()
        )
    except DatabaseError as exc:
        return Check("sweep", False, f"could not be read ({type(exc).__name__})")
    lag = 0.0 if oldest is None else (now - oldest).total_seconds()
    values = {"lag_seconds": round(lag, 1), "max_lag_seconds": max_lag}
    if lag > max_lag:
        return Check(
            "sweep",
            False,
            f"a hold is overdue by {lag:.0f} s (more than {max_lag} s): is the expiry sweep "
            "(llm_budgets.sweep_expired_holds / llm_budgets_sweep) running?",
            values,
        )
    return Check("sweep", True, "keeping up", values)


_installed_at: datetime | None = None


def _app_installed_at() -> datetime | None:
    """When llm_budgets' first migration was applied (remembered per process)."""
    global _installed_at
    if _installed_at is None:
        _installed_at = (
            MigrationRecorder(connection)
            .migration_qs.filter(app="llm_budgets")
            .order_by("applied")
            .values_list("applied", flat=True)
            .first()
        )
    return _installed_at


def _jobs(now: datetime) -> Check:
    slack = conf.HEALTH_SWEEP_MAX_LAG_SECONDS
    try:
        runs = {run.task: run for run in JobRun.objects.all()}
        installed = _app_installed_at()
    except DatabaseError as exc:
        return Check("jobs", False, f"could not be read ({type(exc).__name__})")
    overdue: dict[str, float] = {}
    failing: dict[str, str] = {}
    ages: dict[str, float] = {}
    # Without Stripe the jobs that need it have nothing to deliver or compare.
    for job in sorted(jobs_expected(stripe=bool(conf.STRIPE_API_KEY)), key=lambda j: j.task):
        task, seconds = job.task, job.every
        run = runs.get(task)
        last = run.finished_at if run is not None and run.finished_at is not None else installed
        age = 0.0 if last is None else (now - last).total_seconds()
        if run is not None and run.failed_at is not None:
            failing[task] = f"{task} ({run.error} at {when(run.failed_at, None, seconds=True)})"
            ages[task] = round(age, 1)
        if age > 2 * seconds + slack:
            overdue[task] = ages[task] = round(age, 1)
    # Numbers only, as every check's values: each job named, overdue or failing, with the
    # seconds since it last finished.
    values: dict[str, Any] = dict(sorted(ages.items()))
    problems = []
    if failing:
        problems.append(
            f"failing: {', '.join(failing.values())}; the worker's (or cron's) log has the error."
        )
    if overdue:
        names = ", ".join(f"{task} ({age:.0f} s)" for task, age in overdue.items())
        problems.append(
            f"overdue: {names}; is beat (or cron) running them? See docs/operations.md, "
            "'Wiring the schedule'."
        )
    if problems:
        return Check("jobs", False, " ".join(problems), values)
    return Check("jobs", True, "every job ran in time", values)
