"""When each scheduled job last finished: what ``/health`` reads to name a job that stopped."""

from __future__ import annotations

from django.db import models


class JobRun(models.Model):
    """The last time a job (its Celery task or its management command) finished. One row per
    job, named by its task name (``llm_budgets.schedule.JOBS``)."""

    task = models.CharField(max_length=100, primary_key=True)
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["task"]

    def __str__(self) -> str:
        return f"{self.task} at {self.finished_at:%Y-%m-%d %H:%M:%S}"
