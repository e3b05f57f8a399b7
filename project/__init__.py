"""The demo project. Its Celery app loads with Django so ``@shared_task`` binds to it.

Celery is an optional extra of the app; without it the project still runs (tasks are then
unavailable and every job runs from its management command)."""

from __future__ import annotations

try:
    from project.celery import app as celery_app
except ImportError:  # pragma: no cover - celery not installed
    celery_app = None

__all__ = ("celery_app",)
