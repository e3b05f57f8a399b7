"""The demo project's Celery app (Celery's "First steps with Django").

Settings come from ``project.settings`` under the ``CELERY_`` namespace; tasks are discovered in
every installed app's ``tasks`` module (``llm_budgets.tasks``). Run a worker and beat with::

    celery -A project worker -l INFO
    celery -A project beat -l INFO -S django_celery_beat.schedulers:DatabaseScheduler

The worker runs :class:`llm_budgets.celery_worker.Consumer` (``CELERY_WORKER_CONSUMER``),
Celery's own made to survive a lost Redis connection (docs/reliability.md, "Redis").
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
