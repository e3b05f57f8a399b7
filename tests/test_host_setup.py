"""Setup papercuts a newcomer hit (issue 23): what is missing is named, commands instead of the
shell, and SQLite's missing IMMEDIATE said where it shows."""

from __future__ import annotations

import importlib.util
import io
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import OperationalError, connections
from django.test import override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.billing.checks import check_linked_without_key
from llm_budgets.checks import check_api_key_app, check_docs_apps, check_row_locking
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.exceptions import BudgetExceeded, LedgerUnavailable
from llm_budgets.models import AuditEvent, Membership, StripeCustomerLink, Tenant
from tests.concurrency import run_threads
from tests.factories import reserve_30, seed
from tests.servers import ROOT


def test_a_missing_api_key_app_is_a_check_error_not_a_traceback(tmp_path: Path) -> None:
    """Django starts without 'rest_framework_api_key' (its models module would refuse to load),
    so plain ``check`` names the app with its id and hint."""
    (tmp_path / "host_settings.py").write_text(
        "from project.settings import *  # noqa\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'rest_framework_api_key']\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "host_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "(llm_budgets.E092) 'rest_framework_api_key' is not in INSTALLED_APPS" in done.stderr
    assert "HINT: Add 'rest_framework_api_key' to INSTALLED_APPS" in done.stderr
    assert "System check identified 1 issue" in done.stderr  # nothing else fails for it


def test_the_api_key_base_stands_in_with_the_same_fields() -> None:
    """Without the app, ``models/api_key_base.py`` defines djangorestframework-api-key's fields
    itself: the same ones, or a host lacking the app would see llm_budgets' models change."""
    from rest_framework_api_key.models import AbstractAPIKey

    path = ROOT / "llm_budgets" / "models" / "api_key_base.py"
    spec = importlib.util.spec_from_file_location("llm_budgets.models._stand_in", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    installed = apps.is_installed
    lacking = {"rest_framework_api_key"}
    with mock.patch.object(
        apps, "is_installed", lambda name: name not in lacking and installed(name)
    ):
        spec.loader.exec_module(module)
    stand_in = module.AbstractAPIKey
    assert stand_in is not AbstractAPIKey
    assert [f.deconstruct() for f in stand_in._meta.local_fields] == [
        f.deconstruct() for f in AbstractAPIKey._meta.local_fields
    ]
    for option in ("abstract", "ordering", "verbose_name", "verbose_name_plural"):
        assert getattr(stand_in._meta, option) == getattr(AbstractAPIKey._meta, option), option
    assert check_api_key_app() == []  # installed here


def test_missing_docs_apps_are_named_by_the_checks() -> None:
    installed = apps.is_installed
    lacking = {"drf_spectacular", "drf_spectacular_sidecar"}
    with mock.patch.object(
        apps, "is_installed", lambda name: name not in lacking and installed(name)
    ):
        assert [m.id for m in check_docs_apps()] == ["llm_budgets.E068", "llm_budgets.W069"]
        with override_settings(LLM_BUDGETS={"API_DOCS_ACCESS": "off"}):
            assert check_docs_apps() == []
    assert check_docs_apps() == []


def test_sync_prices_without_the_extra_names_it() -> None:
    gone = {name: None for name in ("genai_prices", "genai_prices.data", "genai_prices.types")}
    with mock.patch.dict(sys.modules, gone), pytest.raises(CommandError, match=r"\[prices\]"):
        call_command("llm_budgets_sync_prices", "--dry-run", stdout=io.StringIO())


@pytest.mark.django_db
def test_the_stripe_warning_shows_in_plain_check() -> None:
    seed()
    StripeCustomerLink.objects.create(
        tenant=Tenant.objects.get(), customer_id="cus_1", linked_at=timezone.now()
    )
    with override_settings(LLM_BUDGETS={}):
        # As plain `manage.py check` calls it: no --database (run_checks() itself would, on
        # Django 6.1, also run the model checks against the 'replica' alias).
        ids = [message.id for message in check_linked_without_key(databases=None)]
    assert "llm_budgets.W070" in ids


def _without_immediate() -> dict:
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    options.pop("transaction_mode", None)
    return saved


@pytest.mark.skipif(
    connections["default"].vendor != "sqlite", reason="SQLite's write lock at BEGIN"
)
def test_sqlite_without_immediate_warns_in_plain_check_and_in_the_refusal() -> None:
    options = connections["default"].settings_dict["OPTIONS"]
    saved = _without_immediate()
    try:
        assert [w.id for w in check_row_locking()] == ["llm_budgets.W001"]  # no --database
        cause = sqlite3.OperationalError("database is locked")
        cause.sqlite_errorcode = 5  # SQLITE_BUSY, as sqlite3 sets it
        with pytest.raises(LedgerUnavailable) as refused, ledger_guard("admission"):
            raise OperationalError("database is locked") from cause
        assert "database is locked" in refused.value.message
        assert "'transaction_mode': 'IMMEDIATE'" in refused.value.message
    finally:
        options.clear()
        options.update(saved)
    assert check_row_locking() == []
    with pytest.raises(LedgerUnavailable) as refused, ledger_guard("admission"):
        raise OperationalError("database is locked") from cause
    assert "IMMEDIATE" not in refused.value.message  # configured: another writer was slow


@pytest.mark.django_db
def test_the_tenant_command_creates_through_the_service_and_shows() -> None:
    out = io.StringIO()
    call_command(
        "llm_budgets_tenant",
        "create",
        "acme",
        "--name",
        "Acme",
        "--timezone",
        "Europe/Amsterdam",
        stdout=out,
    )
    tenant = Tenant.objects.get(external_id="acme")
    assert (tenant.name, tenant.timezone) == ("Acme", "Europe/Amsterdam")
    assert AuditEvent.objects.filter(action="tenant.create", actor="manage.py").exists()
    call_command("llm_budgets_tenant", "show", "acme", stdout=out)
    assert "Europe/Amsterdam" in out.getvalue()
    with pytest.raises(CommandError, match="timezone"):
        call_command("llm_budgets_tenant", "create", "acme", "--timezone", "Mars/Olympus")
    with pytest.raises(CommandError, match="nope"):
        call_command("llm_budgets_tenant", "show", "nope")


@pytest.mark.django_db
def test_the_membership_command_adds_changes_and_removes() -> None:
    seed()
    user = get_user_model().objects.create_user(username="ada", password=None)
    out = io.StringIO()
    call_command("llm_budgets_membership", "add", "ada", "acme", "--role", "admin", stdout=out)
    assert Membership.objects.get(user=user).role == "admin"
    call_command("llm_budgets_membership", "add", "ada", "acme", stdout=out)
    membership = Membership.objects.get(user=user)
    assert membership.role == "member"
    assert f"sees end user {user.pk}." in out.getvalue()  # END_USER_ID's default
    call_command("llm_budgets_membership", "remove", "ada", "acme", stdout=out)
    assert not Membership.objects.exists()
    with pytest.raises(CommandError, match="No user has username 'bob'"):
        call_command("llm_budgets_membership", "add", "bob", "acme")
    with pytest.raises(CommandError, match="beta"):
        call_command("llm_budgets_membership", "add", "ada", "beta")


@pytest.mark.skipif(
    connections["default"].vendor != "sqlite", reason="SQLite's write lock at BEGIN"
)
@pytest.mark.django_db(transaction=True)
def test_a_race_on_sqlite_without_immediate_is_refused_on_the_budget_not_the_lock() -> None:
    """10 calls of 30 at once under a limit of 100, SQLite left in its default (DEFERRED)
    transaction mode: 3 admitted, 7 BudgetExceeded; none refused as 'database is locked'."""
    seed(limit="100")
    options = connections.settings["default"].setdefault("OPTIONS", {})
    saved = dict(options)
    options.pop("transaction_mode", None)  # each thread's new connection reads this
    try:
        results = run_threads(10, lambda _: reserve_30())
    finally:
        options.clear()
        options.update(saved)
    unexpected = [r for r in results if not isinstance(r, budgets.Hold | BudgetExceeded)]
    assert not unexpected, unexpected
    assert sum(isinstance(r, budgets.Hold) for r in results) == 3


@pytest.mark.django_db
def test_a_bad_setting_is_reported_once_and_crashes_no_other_check() -> None:
    bad = {"STRIPE_API_KEY": "whsec_wrong_place", "API_DOCS_ACCESS": "everyone"}
    with override_settings(LLM_BUDGETS=bad):
        # databases=[]: Django 6.1 runs the database checks against every alias when none is
        # named, 'replica' included; the checks here read settings only.
        ids = [message.id for message in run_checks(databases=[])]
    assert "llm_budgets.E070" in ids
    assert "llm_budgets.E066" in ids
