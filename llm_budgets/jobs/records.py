"""Recording how each scheduled job's last run ended, whichever way it ran (a Celery task under
beat or a management command under cron), so ``/health`` can name the jobs that have stopped
running and those whose runs fail."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime
from typing import ParamSpec, TypeVar

from django.db import DatabaseError
from django.utils import timezone

from llm_budgets.models.schedule import JobRun

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)


def job_finished(task: str, *, now: datetime | None = None) -> None:
    """Record that ``task`` (a ``Job.task`` of ``llm_budgets.schedule``) finished now, clearing
    a failure recorded before: one upsert."""
    JobRun.objects.bulk_create(
        [JobRun(task=task, finished_at=now or timezone.now(), failed_at=None, error="")],
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["finished_at", "failed_at", "error"],
    )


def job_failed(task: str, error: BaseException, *, now: datetime | None = None) -> None:
    """Record that a run of ``task`` raised ``error`` now: its class, never its message (which
    may name a tenant; ``/health`` is public). The last finished run stays as it was."""
    JobRun.objects.bulk_create(
        [JobRun(task=task, failed_at=now or timezone.now(), error=error_class(error))],
        update_conflicts=True,
        unique_fields=["task"],
        update_fields=["failed_at", "error"],
    )


def error_class(error: BaseException) -> str:
    """``ZeroDivisionError``, ``django.db.utils.OperationalError``: the class, with its module
    unless it is a builtin."""
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return name[: JobRun._meta.get_field("error").max_length]


def job_recorded(task: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a job's task or command ``handle``: a run that returns is recorded as finished,
    one that raises as failed (and the exception goes on, as it came)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                result = function(*args, **kwargs)
            except Exception as exc:
                try:
                    job_failed(task, exc)
                except DatabaseError:
                    # A database that is down is often why the job failed: /health's database
                    # check names that; the job's own exception is the one to raise.
                    logger.warning("could not record the failed run of %s", task, exc_info=True)
                raise
            job_finished(task)
            return result

        return run

    return decorate
