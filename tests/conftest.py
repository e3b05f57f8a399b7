from __future__ import annotations

import os
from collections.abc import Iterator

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

# The host matrix's generated projects run their own tests (tests/hosts/inside) in their own
# process, with their own settings (tests/test_host_matrix.py); this suite must not collect them.
collect_ignore.append("hosts/inside")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Playwright's sync API leaves an event loop running in the main thread (tests/browser.py).
    browser_tests_last(items)
    ledger_allowed(items)


def ledger_allowed(items: list[pytest.Item]) -> None:
    """Tests that commit for real (``transaction=True``) also allow the ledger's own connection,
    so they run admission and settlement as production does, on a connection of their own
    (llm_budgets.db.ledger; a test that does not allow it joins the test's connection)."""
    from django.db import connections

    from llm_budgets.db.ledger import LEDGER_ALIAS

    if LEDGER_ALIAS not in connections:  # SQLite: the ledger joins the caller's connection
        return
    for item in items:
        marker = item.get_closest_marker("django_db")
        if marker is None:
            continue
        kwargs = dict(marker.kwargs)
        if marker.args:
            kwargs.setdefault("transaction", marker.args[0])
        databases = kwargs.get("databases")
        if not kwargs.get("transaction") or databases == "__all__":
            continue
        kwargs["databases"] = [*(databases or ["default"]), LEDGER_ALIAS]
        item.add_marker(pytest.mark.django_db(**kwargs), append=False)


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


@pytest.fixture(autouse=True)
def _forget_linked_tenants() -> None:
    # The outbox caches which tenant ids are linked to Stripe, per process. A test's rollback
    # lets SQLite hand the same ids to the next test's tenants, which would then look linked.
    from llm_budgets.engine.outbox import linked_cache_clear

    linked_cache_clear()


@pytest.fixture(autouse=True)
def _forget_alert_subscriptions() -> None:
    # Alerts cache which (tenant, type) pairs have endpoints, per process: ids repeat after a
    # test's rollback too.
    from llm_budgets.alerts.emit import alerts_cache_clear

    alerts_cache_clear()


@pytest.fixture
def application_clock() -> Iterator[None]:
    """Admission reads this process's clock, so ``time_machine`` moves it (the app reads the
    database's clock: ``llm_budgets.db.dbclock``). For tests that travel in time."""
    from llm_budgets.db.dbclock import following_application_clock

    with following_application_clock():
        yield
