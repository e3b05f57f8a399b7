from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

# The PgBouncer leg (make test-pgbouncer): every connection goes through a transaction pooler.
if os.environ.get("LLMB_PGBOUNCER"):
    pytest_plugins = ["tests.pgbouncer"]
    collect_ignore: list[str] = []
else:
    collect_ignore = ["test_pooler.py"]
# The real-browser fixture, for every test module (tests/browser.py).
from tests.browser import browser_tests_last, chromium_browser, uses_browser  # noqa: F401


def _flush_by_delete() -> None:
    """After each test that commits for real (``transaction=True``), Django empties every table
    with one ``TRUNCATE`` of all of them, which on PostgreSQL makes new files for each table and
    index: about 0.3 s a test (files of such tests ran in half the time without it). ``DELETE``
    empties tables of a few rows in milliseconds. Django's foreign keys are deferrable, so the
    order does not matter. Sequences are not restarted, as ``TRUNCATE`` without
    ``reset_sequences`` does not (no test asks for it, nor for ``allow_cascade``: those cases keep
    Django's statement)."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncating = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations,
        style: Any,
        tables: Sequence[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or allow_cascade or not tables:
            return truncating(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        deletes = [f"DELETE FROM {self.quote_name(name)}" for name in tables]
        return ["SET CONSTRAINTS ALL DEFERRED", *deletes]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign,assignment]


_flush_by_delete()

# The host matrix's generated projects run their own tests (tests/hosts/inside) in their own
# process, with their own settings (tests/test_host_matrix.py); this suite must not collect them.
collect_ignore.append("hosts/inside")


def pytest_itemcollected(item: pytest.Item) -> None:
    # A test that drives chromium is a browser test for ``-m`` too (CI runs them in a leg of
    # their own), whether or not it carries the mark.
    if uses_browser(item):
        item.add_marker(pytest.mark.browser)


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


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> Iterator[None]:
    """MD5 for every test user's password: Django's PBKDF2 costs about a quarter of a second of
    CPU per hash and per login, in every leg, and no test here is about hashing."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


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
    from llm_budgets.billing.outbox import linked_cache_clear

    linked_cache_clear()


@pytest.fixture(autouse=True)
def _forget_response_chains() -> None:
    # The guards remember answered responses by (tenant, provider, id), per process; the fake
    # providers number their ids from 1 in each test, so an earlier test's record would hold a
    # later test's call at the wrong chain.
    from llm_budgets.integrations.chains import chains_clear

    chains_clear()


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
