"""When each scheduled job last finished, and whether its last run failed: what ``/health``
reads to name a job that stopped or keeps failing."""

from __future__ import annotations

from django.db import models


class JobRun(models.Model):
    """One row per job (its Celery task or its management command), named by its task name
    (``llm_budgets.schedule.JOBS``): its last finished run, and its last failed run when that
    came after (a run that finishes clears it)."""

    task = models.CharField(max_length=100, primary_key=True)
    finished_at = models.DateTimeField(
        null=True, blank=True, help_text="The last run that finished; empty if none has yet."
    )
    failed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The last run that raised, if no run has finished since; empty otherwise.",
    )
    error = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="The class of that run's exception (never its message).",
    )

    class Meta:
        ordering = ["task"]

    def __str__(self) -> str:
        if self.failed_at is not None:
            return f"{self.task} failed ({self.error}) at {self.failed_at:%Y-%m-%d %H:%M:%S}"
        if self.finished_at is None:
            return f"{self.task} (never finished)"
        return f"{self.task} at {self.finished_at:%Y-%m-%d %H:%M:%S}"
