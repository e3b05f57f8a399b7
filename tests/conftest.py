from __future__ import annotations

import os

import pytest
from django.db import connection

# The PgBouncer leg (make test-pgbouncer): every connection goes through a transaction pooler.
if os.environ.get("LLMB_PGBOUNCER"):
    pytest_plugins = ["tests.pgbouncer"]
    collect_ignore: list[str] = []
else:
    collect_ignore = ["test_pooler.py"]
# The real-browser fixture, for every test module (tests/browser.py).
from tests.browser import browser_tests_last, chromium_browser  # noqa: F401


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Playwright's sync API leaves an event loop running in the main thread (tests/browser.py).
    browser_tests_last(items)


def pytest_report_header() -> str:
    url = os.environ.get("DATABASE_URL", "(default SQLite)")
    return f"llm_budgets: DATABASE_URL={url}"


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"


class NetworkAttempted(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Fail any Python-level network attempt (connect or DNS). psycopg talks to PostgreSQL
    through libpq, not Python sockets, so the test database keeps working. Returns the
    attempts."""
    import socket

    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise NetworkAttempted(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts
