"""Recording that a scheduled job finished, whichever way it ran (a Celery task under beat or a
management command under cron), so ``/health`` can name the jobs that have stopped running."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import ParamSpec, TypeVar

from django.utils import timezone

from llm_budgets.models.schedule import JobRun

P = ParamSpec("P")
R = TypeVar("R")


def job_finished(task: str, *, now: datetime | None = None) -> None:
    """Record that ``task`` (a name in ``schedule.JOBS``) finished now: one upsert."""
    JobRun.objects.bulk_create(
        [JobRun(task=task, finished_at=now or timezone.now())],
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["finished_at"],
    )


def job_recorded(task: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a job's task or command ``handle``: a run that returns is recorded as finished
    (one that raises is not, so a failing job shows as overdue)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            result = function(*args, **kwargs)
            job_finished(task)
            return result

        return run

    return decorate
