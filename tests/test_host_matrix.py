"""The host matrix: small host projects generated in a temporary directory, each adding
llm_budgets as the README says plus one convention of a real SaaS (email login without
``username``; ATOMIC_REQUESTS and strict DRF defaults with its own schema; django-celery-beat's
DatabaseScheduler; a base template with other block names; django-tenants), each running its own
test suite inside the host with the kit (tests/hosts/inside/): migrate (the test database), check,
every admin changelist with a search, the pages as tenant admin / member / support, the API's
reserve-commit, the schedule install, and a guarded view through the Django helper.

The hosts run side by side (one subprocess each, started together on first use); each case here
reads one inner test's outcome. docs/adopting.md is the recipe they follow."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import environ
import pytest

from tests.hosts.generate import Host
from tests.hosts.hosts import ATOMIC_REQUESTS, DJANGO_TENANTS, SQLITE_HOSTS
from tests.hosts.run import Run, finish, start

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres", "pgsql"))

COMMON = [
    "test_llm_budgets_is_the_checkouts",
    "test_check_passes",
    "test_every_admin_changelist_answers_a_search",
    "test_pages_for_tenant_admin_member_and_support",
    "test_api_reserve_then_commit",
    "test_schedule_install",
    "test_guarded_view_streams_and_charges",
    "test_one_identity_for_end_users",
    "test_kit_moves_admission_with_time_machine",
]

HOSTS: dict[str, Host] = {
    host.name: host for host in [*SQLITE_HOSTS, DJANGO_TENANTS, ATOMIC_REQUESTS]
}
# Hosts on a PostgreSQL database of their own, beside the suite's (its name, suffixed).
POSTGRES_HOSTS = {"django_tenants": "_tenants", "atomic_requests": "_atomic"}

# Why a host cannot run here: a documented condition, never a silent skip.
EXCLUDED: dict[str, tuple[bool, str]] = {
    # pyproject installs django-celery-beat only below Python 3.12: its 2.9 caps Django < 6.1,
    # and CI's Python 3.13 leg runs Django 6.x. Anywhere else a missing package fails the case.
    "celery_beat": (
        sys.version_info >= (3, 12),
        "django-celery-beat is not installed on Python >= 3.12 (it caps Django < 6.1; CI's "
        "Python 3.13 leg runs Django 6.x): the DatabaseScheduler host cannot be built there",
    ),
    # Schema per tenant is PostgreSQL's: the host runs in CI's PostgreSQL leg.
    "django_tenants": (
        not ON_POSTGRES,
        "django-tenants needs PostgreSQL (schemas): runs when DATABASE_URL is PostgreSQL",
    ),
    # The ledger's own connection is PostgreSQL's: on SQLite (one writer) it joins the request's
    # transaction, and parallel requests queue for the write lock (docs/operations.md).
    "atomic_requests": (
        not ON_POSTGRES,
        "the ledger has a connection of its own on PostgreSQL only: runs when DATABASE_URL is "
        "PostgreSQL",
    ),
}

# Findings of issue 23 that the matrix shows; strict xfail until the fix is merged.
FINDINGS: dict[tuple[str, str], str] = {}


def inner_tests(host: Host) -> list[str]:
    extra = Path(__file__).parent / "hosts" / "inside" / f"test_{host.name}.py"
    names = list(COMMON)
    if extra.exists():
        names += [
            line.split("(")[0].removeprefix("def ")
            for line in extra.read_text().splitlines()
            if line.startswith("def test_")
        ]
    return names


def _cases() -> Iterator[object]:
    for name, host in HOSTS.items():
        excluded, why = EXCLUDED.get(name, (False, ""))
        for check in inner_tests(host):
            marks = [pytest.mark.skipif(excluded, reason=why)]
            if (name, check) in FINDINGS:
                marks.append(pytest.mark.xfail(strict=True, reason=FINDINGS[name, check]))
            yield pytest.param(name, check, marks=marks, id=f"{name}-{check}")


def _postgres_env(suffix: str) -> dict[str, str]:
    """A PostgreSQL host's own database, beside the suite's (same server and user)."""
    config = environ.Env.db_url_config(os.environ["DATABASE_URL"])
    name = f"{config['NAME']}{suffix}"
    return {
        "HOST_PG_NAME": name,
        "HOST_PG_TEST_NAME": f"{name}_test",
        "HOST_PG_USER": str(config.get("USER") or "postgres"),
        "HOST_PG_PASSWORD": str(config.get("PASSWORD") or ""),
        "HOST_PG_HOST": str(config.get("HOST") or "127.0.0.1"),
        "HOST_PG_PORT": str(config.get("PORT") or 5432),
    }


class Matrix:
    """Every host that can run here, started together; each waited for when first asked."""

    def __init__(self, root: Path, wanted: set[str]) -> None:
        self.root = root
        self.running: dict[str, subprocess.Popen[str]] = {}
        self.done: dict[str, Run] = {}
        for name, host in HOSTS.items():
            if EXCLUDED.get(name, (False, ""))[0] or name not in wanted:
                continue
            env = _postgres_env(POSTGRES_HOSTS[name]) if name in POSTGRES_HOSTS else None
            self.running[name] = start(host, root, env)

    def run(self, name: str) -> Run:
        if name not in self.done:
            self.done[name] = finish(HOSTS[name], self.root, self.running.pop(name))
        return self.done[name]

    def stop(self) -> None:
        for process in self.running.values():
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    # Only the hosts of the selected cases (e.g. `-k email_login`) are started.
    wanted = {
        item.callspec.params["host"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_host"
    }
    runs = Matrix(tmp_path_factory.mktemp("hosts"), wanted)
    yield runs
    runs.stop()


@pytest.mark.parametrize(("host", "check"), list(_cases()))
def test_host(matrix: Matrix, host: str, check: str) -> None:
    run = matrix.run(host)
    outcome = run.outcomes.get(check)
    assert outcome is not None, f"{check} did not run in host {host}:\n{run.output[-4000:]}"
    assert outcome.status == "passed", f"{host}: {check} {outcome.status}\n{outcome.message}"
