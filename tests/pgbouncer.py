"""The PgBouncer leg (``make test-pgbouncer``): a pytest plugin, loaded by tests/conftest.py when
``LLMB_PGBOUNCER=1``, that starts Debian's ``pgbouncer`` on 127.0.0.1 (a free port) in
**transaction** pooling mode in front of the test database's PostgreSQL, and routes every test
connection through it once the test database exists.

The test database is created and dropped directly on PostgreSQL (a pooler keeps server connections
open, which would block ``DROP DATABASE``); everything the tests do goes through the pooler:
threads, forked processes and subprocesses all read the same settings dict. PgBouncer 1.18 has no
prepared-statement support, so the leg runs without ``prepare_threshold`` (Django's default).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from tests.services import free_port

# Besides every test marked ``concurrency`` (threads, processes, lock waits, fail closed), the leg
# runs these whole modules: the statements layer (psycopg pipelines) and admission/settlement.
POOLER_MODULES = ("test_statements.py", "test_admission.py", "test_settlement.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in POOLER_MODULES:
            item.add_marker(pytest.mark.pooler)


class Pooler:
    """One pgbouncer process: its port, its admin console, its log."""

    def __init__(self, *, upstream_host: str, upstream_port: int, user: str) -> None:
        self.port = free_port()
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix="llmb-pgbouncer-"))
        self.dir.chmod(0o777)  # pgbouncer refuses to run as root: it runs as `postgres`
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={upstream_host} port={upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            f"admin_users = {user}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            "default_pool_size = 60\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        command = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "postgres"]
        # Its output goes to a file: a pipe nobody reads fills up and blocks the pooler.
        self.output = (self.dir / "stderr.log").open("wb")
        self.process = subprocess.Popen(command, stdout=self.output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (self.dir / "stderr.log").read_text()
                raise RuntimeError(f"pgbouncer exited at start: {err}{self.log()}")
            try:
                self.admin("SHOW VERSION")
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not answer within 15 s: {self.log()}")

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Run a command on the admin console (``SHOW POOLS``...), rows as dicts."""
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            dbname="pgbouncer",
            user=self.user,
            autocommit=True,
            connect_timeout=2,
            row_factory=dict_row,
        ) as conn:
            cur = conn.execute(command, prepare=False)
            return list(cur.fetchall()) if cur.description else []

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self.output.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[Pooler]:
    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        pytest.fail("LLMB_PGBOUNCER=1 needs DATABASE_URL on PostgreSQL")
    pooler = Pooler(
        upstream_host=db["HOST"] or "127.0.0.1",
        upstream_port=int(db["PORT"] or 5432),
        user=db["USER"] or "postgres",
    )
    try:
        pooler.start()
    except Exception as exc:  # a missing pooler fails this leg: it only runs to test the pooler
        pooler.stop()
        pytest.fail(f"PgBouncer is needed for this leg and could not start: {exc}")
    yield pooler
    pooler.stop()


@pytest.fixture(scope="session", autouse=True)
def through_pgbouncer(
    django_db_setup: None, django_db_blocker: Any, pgbouncer: Pooler
) -> Iterator[None]:
    """Once the test database exists, send every connection through the pooler; on the way
    out, back to PostgreSQL directly, so the test database can be dropped."""
    db = settings.DATABASES["default"]
    direct = db["HOST"], db["PORT"]
    with django_db_blocker.unblock():
        connections.close_all()
    for settings_dict in {id(d): d for d in (db, connections["default"].settings_dict)}.values():
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", str(pgbouncer.port)
    yield
    with django_db_blocker.unblock():
        connections.close_all()
    for settings_dict in {id(d): d for d in (db, connections["default"].settings_dict)}.values():
        settings_dict["HOST"], settings_dict["PORT"] = direct
    pgbouncer.stop()
