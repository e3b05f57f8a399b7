"""The demo project's Celery app with the sweep and the warning scan due every second: what the
end-to-end test's beat runs when django-celery-beat (the database scheduler) is not installed."""

from __future__ import annotations

from llm_budgets.schedule import BEAT_SCHEDULE
from project.celery import app

FAST_TASKS = {"llm_budgets.sweep_expired_holds", "llm_budgets.scan_thresholds"}

app.conf.beat_schedule = {
    name: {**entry, "schedule": 1.0, "options": {"expires": 10.0}}
    for name, entry in BEAT_SCHEDULE.items()
    if entry["task"] in FAST_TASKS
}

__all__ = ["app"]
