"""End to end: a real Celery worker and beat (subprocesses) against Redis, on this test's
database. Beat reads its schedule from django-celery-beat rows, as in the demo project (or, where
that package is not installed, from the ready dict); the worker sweeps an overdue hold and emails a
warning (file backend: visible across processes)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from llm_budgets.models import DeliveryState, Reservation, ReservationState, ThresholdCrossing
from tests.celery_e2e_app import FAST_TASKS
from tests.celery_processes import celery_processes
from tests.factories import billing_contacts, price_fake, reserve_30, reserve_30_at, seed
from tests.services import redis_ping, require

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]

DEADLINE_SECONDS = 120


def _beat_arguments(tmp_path: Path) -> list[str]:
    """Beat with the sweep and the warning scan due every second."""
    if importlib.util.find_spec("django_celery_beat") is None:
        return ["-A", "tests.celery_e2e_app", "beat", f"--schedule={tmp_path / 'beat-schedule'}"]
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
    for task in FAST_TASKS:
        PeriodicTask.objects.create(name=f"e2e {task}", task=task, interval=every)
    return ["-A", "project", "beat", "--scheduler=django_celery_beat.schedulers:DatabaseScheduler"]


@contextmanager
def celery_worker_and_beat(tmp_path: Path) -> Iterator[Path]:
    """Start a worker and beat on this test's database; yield the directory mail is written to."""
    mail_dir = tmp_path / "mail"
    with celery_processes(
        tmp_path,
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
    ) as celery:
        celery.worker()
        celery.start(
            "beat",
            [*_beat_arguments(tmp_path), f"--pidfile={tmp_path / 'beat.pid'}", "--loglevel=INFO"],
        )
        yield mail_dir


def test_worker_and_beat_sweep_an_overdue_hold_and_send_a_warning(tmp_path: Path) -> None:
    require("Redis", redis_ping)
    price_fake(effective_from=timezone.now() - timedelta(days=1))
    seed(limit="100")
    billing_contacts("billing@acme.test")
    overdue = reserve_30_at(timezone.now() - timedelta(seconds=30), ttl=1)
    reserve_30()  # 60 of 100 in use: the 50 % threshold is reached

    with celery_worker_and_beat(tmp_path) as mail_dir:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            swept = Reservation.objects.get(pk=overdue.pk).state == ReservationState.EXPIRED
            sent = ThresholdCrossing.objects.filter(state=DeliveryState.SENT).exists()
            if swept and sent:
                break
            time.sleep(0.5)  # polling for an outcome, bounded by the deadline
        assert Reservation.objects.get(pk=overdue.pk).state == ReservationState.EXPIRED
        crossing = ThresholdCrossing.objects.get()
        assert (crossing.threshold, crossing.state) == (50, DeliveryState.SENT)
    [message] = [path.read_text() for path in mail_dir.iterdir()]
    assert "To: billing@acme.test" in message
    assert "Subject: Acme: 50% of your month LLM budget used" in message
