"""The jobs' declarations (``llm_budgets.schedule``) against what is derived from them and what
describes them: the Celery tasks, the installed apps' jobs, and docs/operations.md's table."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.apps import apps

from llm_budgets import tasks
from llm_budgets.schedule import BEAT_SCHEDULE, JOBS, Job, jobs_expected, jobs_installed
from project import celery_app

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
UNITS = {"s": 1, "min": 60, "h": 60 * 60}

# A job of another app, declared in a module of its own as a contrib app would.
EXTRA = (Job("other: job", "other.job", 5, "A job of another app.", needs="stripe"),)


def documented_jobs() -> dict[str, int]:
    """docs/operations.md's table of jobs: each Celery task named, with its interval in seconds
    (rows without a task, such as the conservation check, left out)."""
    text = OPERATIONS.read_text()
    start = text.index("## The jobs")
    table = text[start : text.index("\n## ", start + 1)]
    jobs = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) != 5 or cells[0] in ("Job", "---"):
            continue
        task = re.match(r"`([\w.]+)`", cells[1])
        if task is None:
            continue
        every = re.fullmatch(r"every (\d+) (s|min|h)", cells[3])
        jobs[task[1]] = (
            24 * 60 * 60 if cells[3] == "daily" else int(every[1]) * UNITS[every[2]] if every else 0
        )
    return jobs


def test_the_operations_table_lists_every_job_at_its_interval() -> None:
    documented = documented_jobs()
    declared = {job.task: job.every for job in jobs_installed()}
    assert sorted(set(documented) - set(declared)) == [], "documented, not declared"
    assert sorted(set(declared) - set(documented)) == [], "declared, not in docs/operations.md"
    assert documented == declared


def test_each_job_is_declared_once() -> None:
    assert len({job.name for job in JOBS}) == len({job.task for job in JOBS}) == len(JOBS)
    assert list(BEAT_SCHEDULE) == [job.name for job in JOBS]


def test_every_llm_budgets_task_is_a_declared_job_or_sent_by_one() -> None:
    ours = {name for name in celery_app.tasks if name.startswith("llm_budgets.")}
    assert ours == {job.task for job in JOBS} | {tasks.send_threshold_warning.name}
    assert tasks.sweep_expired_holds.name == "llm_budgets.sweep_expired_holds"


def test_an_apps_jobs_count_only_while_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert jobs_installed() == JOBS
    configs = [*apps.get_app_configs(), SimpleNamespace(llm_budgets_jobs=f"{__name__}.EXTRA")]
    monkeypatch.setattr(apps, "get_app_configs", lambda: configs)
    assert jobs_installed() == JOBS + EXTRA
    assert EXTRA[0] not in jobs_expected(stripe=False)
    assert EXTRA[0] in jobs_expected(stripe=True)
