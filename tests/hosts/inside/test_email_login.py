"""The newcomer's host (email login): what check says when the README's apps are only partly
added ("add those you lack"), and docs/adopting.md's step 8 as its "Email login" section writes
it for this host."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from tests.doc_commands import EMAIL_LOGIN_COMMANDS  # generated from tests/hosts/hosts.py

from llm_budgets import budgets
from llm_budgets.models import Membership

HOST = Path(__file__).resolve().parents[1]


def check_without(*apps: str) -> subprocess.CompletedProcess[str]:
    module = HOST / "hostproj" / f"settings_without_{len(apps)}.py"
    module.write_text(
        "from hostproj.settings import *  # noqa: F403\n"
        f"INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in {apps!r}]\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": f"hostproj.{module.stem}"}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=HOST,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_names_a_missing_api_key_app() -> None:
    done = check_without("rest_framework_api_key")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "(llm_budgets.E092) 'rest_framework_api_key' is not in INSTALLED_APPS" in done.stderr


def test_check_names_missing_schema_apps() -> None:
    done = check_without("drf_spectacular", "drf_spectacular_sidecar")
    assert done.returncode != 0
    assert "llm_budgets.E068" in done.stderr
    assert "llm_budgets.W069" in done.stderr


@pytest.mark.django_db
def test_step_8_names_the_user_by_email(monkeypatch: pytest.MonkeyPatch) -> None:
    budgets.ensure_tenant(tenant="acme", name="Acme")
    for line in EMAIL_LOGIN_COMMANDS:
        words = shlex.split(line)
        while "=" in words[0]:  # VAR=value before the command
            name, _, value = words.pop(0).partition("=")
            monkeypatch.setenv(name, value)
        assert words[:2] == ["python", "manage.py"], line
        call_command(*words[2:], stdout=io.StringIO(), stderr=io.StringIO())
    user = get_user_model().objects.get(email="ada@example.com")
    assert user.is_superuser
    assert user.check_password("change-me")
    assert Membership.objects.get(user=user).role == "admin"
    # The username form of the page's main path finds nobody here, and says by which field.
    with pytest.raises(CommandError, match="No user has email 'ada'"):
        call_command("llm_budgets_membership", "add", "ada", "acme", stdout=io.StringIO())
    assert Membership.objects.count() == 1
