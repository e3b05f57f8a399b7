"""The newcomer's host (email login): what check says when the README's apps are only partly
added ("add those you lack")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
