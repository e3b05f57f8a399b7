"""Real Celery processes for the tests (worker, beat) on this test's database and a Redis broker,
each on a queue of its own so other runs on the same Redis never take their tasks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.services import REDIS_URL, subprocess_database_url

ROOT = Path(__file__).resolve().parent.parent
SEND_BOUND = 60.0  # seconds: a bound on one publish (two socket timeouts and a reconnect fit)


class CeleryProcesses:
    """Start workers (and beat) by name; ``send`` puts a task on their queue."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.queue = env["CELERY_TASK_DEFAULT_QUEUE"]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, arguments: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", *arguments],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # its own process group: kill() takes the pool's children too
        )
        self.processes[name] = process
        return process

    def worker(
        self, name: str = "worker", *, pool: str = "solo", **env: str
    ) -> subprocess.Popen[bytes]:
        return self.start(
            name,
            [
                "-A",
                "project",
                "worker",
                f"--pool={pool}",
                "--concurrency=1",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                f"--hostname={name}-{uuid.uuid4().hex[:8]}@%h",
                f"--queues={self.queue}",
                "--loglevel=INFO",
            ],
            **env,
        )

    def kill(self, name: str) -> None:
        """SIGKILL of the worker and its pool's processes (a lost host, the OOM killer)."""
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def send(self, task: str, broker_url: str | None = None) -> None:
        """Publish ``task`` to the queue, as beat would (a producer of our own, with the
        project's transport options: its socket timeouts bound a publish into a silent Redis)."""
        from celery import Celery
        from django.conf import settings

        # Not the current app: tasks the test process runs afterwards keep the project's broker.
        sender = Celery(
            "sender", broker=broker_url or self.env["CELERY_BROKER_URL"], set_as_current=False
        )
        sender.conf.broker_transport_options = {
            **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            "max_retries": 1,  # fail fast: the test expects the error
        }
        outcome: list[BaseException | None] = []

        def publish() -> None:
            try:
                sender.send_task(task, queue=self.queue, retry=False)
                outcome.append(None)
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)
            finally:
                sender.close()

        # In a thread with a deadline: a publish that hangs (no socket timeout) fails the test
        # instead of blocking it forever.
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        thread.join(SEND_BOUND)
        if not outcome:
            raise AssertionError(f"the publish of {task} hung for {SEND_BOUND}s")
        if outcome[0] is not None:
            raise outcome[0]

    def log(self, name: str) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def celery_processes(tmp_path: Path, **env: Any) -> Iterator[CeleryProcesses]:
    """Workers and beat on this test's database and Redis; ``env`` overrides their environment
    (e.g. ``DATABASE_URL`` through a fault proxy). Stopped at the end, the queue forgotten, and
    each log's tail written to stderr (shown when the test failed)."""
    queue = f"llmb-e2e-{uuid.uuid4().hex}"
    base = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PYTHONUNBUFFERED": "1",
        **{k: str(v) for k, v in env.items()},
    }
    processes = CeleryProcesses(tmp_path, base)
    try:
        yield processes
    finally:
        processes.stop()
        forget_queue(queue)
        for name in processes.processes:
            sys.stderr.write(f"--- {name} log (tail) ---\n{processes.log(name)[-3000:]}\n")


def forget_queue(queue: str) -> None:
    """Leave the shared Redis as we found it: drop our queue and kombu's bindings for it."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = [queue, *client.scan_iter(match=f"_kombu.binding*.{queue}")]
    client.delete(*keys)
