"""Real services for the tests that need them: skip when absent on a developer's machine, fail in
CI (``CI=true``), where .ci/run starts them."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest
from django.db import connection

REDIS_URL = os.environ.get("LLMB_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")


def require(service: str, probe: Callable[[], object]) -> None:
    try:
        probe()
    except Exception as exc:
        message = f"{service} is needed for this test and is unavailable: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def redis_ping() -> None:
    import redis

    redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2).ping()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def subprocess_database_url() -> str:
    """DATABASE_URL of the database this test runs on (the test database, not the main one), for
    subprocesses that must see the same rows."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
