"""Generate a host and run its own tests (pytest inside the host, in a subprocess, with the shared
venv's python and this checkout's llm_budgets first on the path); read their outcomes back."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tests.hosts.generate import Host, write

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose llm_budgets is under test
# Generous: the hosts run side by side, and on a busy two-core machine each takes minutes.
TIMEOUT = 1200


@dataclass
class Outcome:
    """One inner test: passed / failed / error / skipped, with the failure's text."""

    status: str
    message: str = ""


@dataclass
class Run:
    host: str
    returncode: int
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0


def start(host: Host, root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Generate ``host`` under ``root`` and start its test run (not waited for)."""
    base = write(root, host)
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST_", "DATABASE_URL"))
    }
    environ.update(
        PYTHONPATH=os.pathsep.join([str(base), str(ROOT)]),
        DJANGO_SETTINGS_MODULE="hostproj.settings",
        LLMB_EXPECTED_ROOT=str(ROOT / "llm_budgets"),
        **(env or {}),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "--junitxml", str(base / "report.xml")],
        cwd=base,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(host: Host, root: Path, process: subprocess.Popen[str]) -> Run:
    output, _ = process.communicate(timeout=TIMEOUT)
    run = Run(host=host.name, returncode=process.returncode, output=output)
    report = root / host.name / "report.xml"
    if not report.exists():
        return run
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        run.seconds += float(case.get("time") or 0)
        status, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                status = kind
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        run.outcomes[name] = Outcome(status, message)
    return run
