"""End to end: a real Celery worker and beat (subprocesses) against Redis, on this test's
database. Beat reads its schedule from django-celery-beat rows, as in the demo project (or, where
that package is not installed, from the ready dict); the worker sweeps an overdue hold and emails a
warning (file backend: visible across processes)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from llm_budgets.models import DeliveryState, Reservation, ReservationState, ThresholdCrossing
from tests.celery_e2e_app import FAST_TASKS
from tests.factories import billing_contacts, price_fake, reserve_30, reserve_30_at, seed
from tests.services import REDIS_URL, redis_ping, require, subprocess_database_url

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
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_TASK_ALWAYS_EAGER": "false",
        # A queue of our own: other runs on the same Redis never take our tasks.
        "CELERY_TASK_DEFAULT_QUEUE": f"llmb-e2e-{uuid.uuid4().hex}",
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(mail_dir),
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    celery = [sys.executable, "-m", "celery"]
    commands = {
        "worker": [
            *celery,
            "-A",
            "project",
            "worker",
            "--pool=solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--hostname=e2e-{uuid.uuid4().hex[:8]}@%h",
            f"--queues={env['CELERY_TASK_DEFAULT_QUEUE']}",
            "--loglevel=INFO",
        ],
        "beat": [
            *celery,
            *_beat_arguments(tmp_path),
            f"--pidfile={tmp_path / 'beat.pid'}",
            "--loglevel=INFO",
        ],
    }
    processes = {}
    try:
        for name, command in commands.items():
            log = (tmp_path / f"{name}.log").open("w")
            processes[name] = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path.cwd()
            )
        yield mail_dir
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _forget_queue(env["CELERY_TASK_DEFAULT_QUEUE"])
    # Keep the logs visible when the test failed.
    for name in commands:
        log_path = tmp_path / f"{name}.log"
        if log_path.exists():
            sys.stderr.write(f"--- {name} log (tail) ---\n{log_path.read_text()[-3000:]}\n")


def _forget_queue(queue: str) -> None:
    """Leave the shared Redis as we found it: drop our queue and kombu's bindings for it."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = [queue, *client.scan_iter(match=f"_kombu.binding*.{queue}")]
    client.delete(*keys)


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
