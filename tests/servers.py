"""Real web processes for the fault tests: ``manage.py runserver`` (no reloader) in its own
process, on the test database, on a free port of 127.0.0.1. Stopped (SIGTERM, then SIGKILL) by
the context manager; ``kill()`` sends SIGKILL for the crash tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.services import free_port, subprocess_database_url

ROOT = Path(__file__).resolve().parent.parent


class WebProcess:
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        log: Path,
        launch: tuple[list[str], dict[str, str]] | None = None,
    ) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.launch = launch  # (command, environment): what relaunch() starts again

    def relaunch(self) -> None:
        """Start the process again on the same port once it has died (e.g. after ``kill()``),
        its output appended to the same log. Returns at once: until the new process listens,
        connections are refused, as a client of a restarting server sees."""
        assert self.launch is not None
        assert self.process.poll() is not None
        command, env = self.launch
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _wait_listening(web: WebProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if web.process.poll() is not None:
            raise RuntimeError(f"web process exited: {web.log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", web.port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"web process did not listen within {timeout}s: {web.log.read_text()}")


@contextmanager
def web_processes(
    count: int,
    tmp_path: Path,
    *,
    llm_budgets: dict[str, Any] | None = None,
    database_url: str | None = None,
    environment: dict[str, str] | None = None,
    checks: bool = True,
) -> Iterator[list[WebProcess]]:
    """``count`` web processes; ``environment``: more variables for them (e.g.
    ``CONN_MAX_AGE``, which the project's settings read); ``checks=False``: start without
    Django's system checks (``--skip-checks``: about 0.6 s of CPU less per start, for tests that
    kill and restart them often)."""
    env = {
        **os.environ,
        **(environment or {}),
        "DJANGO_SETTINGS_MODULE": "tests.server_settings",
        "DATABASE_URL": database_url or subprocess_database_url(),
        "LLMB_TEST_LLM_BUDGETS": json.dumps(llm_budgets or {}),
        "PYTHONUNBUFFERED": "1",
    }
    webs: list[WebProcess] = []
    try:
        for index in range(count):
            port = free_port()
            log = tmp_path / f"web{index}.log"
            command = [
                sys.executable,
                "manage.py",
                "runserver",
                "--noreload",
                "--nothreading",
                *([] if checks else ["--skip-checks"]),
                f"127.0.0.1:{port}",
            ]
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
            )
            webs.append(WebProcess(process, port, log, (command, env)))
        for web in webs:
            _wait_listening(web)
        yield webs
    finally:
        for web in webs:
            web.stop()


@contextmanager
def asgi_server(
    tmp_path: Path, *, llm_budgets: dict[str, Any] | None = None
) -> Iterator[WebProcess]:
    """uvicorn (one worker, Django's ASGI handler) serving ``tests/asgi_views.py`` on the test
    database, on a free port of 127.0.0.1."""
    port = free_port()
    log = tmp_path / "uvicorn.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.asgi_settings",
        "DATABASE_URL": subprocess_database_url(),
        "LLMB_TEST_LLM_BUDGETS": json.dumps(llm_budgets or {}),
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "django.core.asgi:get_asgi_application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    web = WebProcess(process, port, log)
    try:
        _wait_listening(web)
        yield web
    finally:
        web.stop()
