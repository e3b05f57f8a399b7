"""docs/adopting.md, followed start to finish in a fresh ``startproject`` host that already
configures pytest in its ``pyproject.toml`` and wraps every request in a transaction
(``ATOMIC_REQUESTS``): every block of the main path in order (files
written or added to, shell lines run, ``manage.py shell`` blocks fed to it, the host's own tests
run with the kit, ``runserver`` started and asked for the login and usage pages); and every block
of its conventions section builds a host of the matrix."""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from tests.hosts import hosts
from tests.hosts.docs import blocks
from tests.hosts.run import ROOT

PYTHON_BIN = str(Path(sys.executable).parent)

# The existing project's own pytest configuration, as a host keeps it (cookiecutter-django's
# shape): the page's settings line must join it, not replace it.
HOST_PYPROJECT = """\
[project]
name = "mysite"
version = "0.1.0"

[tool.pytest.ini_options]
python_files = ["tests.py", "test_*.py"]
"""


def _env(project: Path) -> dict[str, str]:
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST_", "DATABASE_URL"))
    }
    # `python` is the venv's; this checkout's llm_budgets comes first on the path.
    environ["PATH"] = PYTHON_BIN + os.pathsep + environ.get("PATH", "")
    environ["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    environ["LLMB_EXPECTED_ROOT"] = str(ROOT / "llm_budgets")
    return environ


def _run(command: str, project: Path, env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=project,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _runserver(command: str, project: Path, env: dict[str, str]) -> None:
    """Start it as the page says, check the login page and the usage page's redirect, stop it."""
    port = _free_port()
    server = subprocess.Popen(
        [*shlex.split(command), f"127.0.0.1:{port}", "--noreload"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                login = urllib.request.urlopen(f"{base}/accounts/login/", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "runserver did not answer within 60 s"
                time.sleep(0.2)
        assert login.status == 200
        assert b'name="password"' in login.read()
        usage = urllib.request.urlopen(f"{base}/usage/", timeout=5)  # follows the redirect
        assert usage.url.startswith(f"{base}/accounts/login/?next=/usage/")
    finally:
        server.terminate()
        server.wait(timeout=30)


def _add(path: Path, body: str) -> None:
    """A block labelled "<file>: add": its lines go into the file's table of the same header,
    if the file has that table (a TOML or INI section), else at the end."""
    text = path.read_text()
    header, _, rest = body.partition("\n")
    lines = text.splitlines(keepends=True)
    if header.startswith("[") and header + "\n" in lines:
        at = lines.index(header + "\n") + 1
        path.write_text("".join([*lines[:at], rest, *lines[at:]]))
    else:
        path.write_text(text + "\n" + body)


def _shell_line(line: str, project: Path, env: dict[str, str]) -> str:
    if line.startswith("pip install"):
        # Checked, not performed: the suite runs in that install (`pip install -e ".[dev]"`).
        assert line.split("#")[0].split() == ["pip", "install", "-e", "path/to/llm_budgets"]
        assert 'name = "llm-budgets"' in (ROOT / "pyproject.toml").read_text()
        assert importlib.metadata.distribution("llm-budgets").version
        extras = set(importlib.metadata.metadata("llm-budgets").get_all("Provides-Extra") or [])
        assert {"postgres", "openai", "anthropic", "celery-beat", "prices"} <= extras
    elif line.rstrip().endswith("manage.py runserver"):
        _runserver(line, project, env)
    else:
        return _run(line, project, env)
    return ""


def test_adopting_md_start_to_finish(tmp_path: Path) -> None:
    project = tmp_path / "existing"
    project.mkdir()
    env = _env(project)
    # The existing project the page starts from.
    _run("python -m django startproject mysite .", project, env)
    (project / "pyproject.toml").write_text(HOST_PYPROJECT)
    # Every request in a transaction, as cookiecutter-django sets it (issue #37).
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + '\nDATABASES["default"]["ATOMIC_REQUESTS"] = True\n')
    walked = 0
    outputs: dict[str, str] = {}
    for block in blocks():
        if block.conventions:
            continue
        walked += 1
        if block.lang == "sh":
            for line in block.body.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    outputs[line] = _shell_line(line, project, env)
        elif block.label == "python manage.py shell":
            _run("python manage.py shell", project, env, stdin=block.body)
        elif block.label.endswith(": add"):
            _add(project / block.label.removesuffix(": add"), block.body)
        else:
            path = project / block.label
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
    assert walked >= 15  # the page's main path, not an empty parse
    assert (project / "db.sqlite3").exists()
    # The host's tests ran on its own pytest configuration, the settings line added to it.
    assert not (project / "pytest.ini").exists()
    (tests_run,) = [out for line, out in outputs.items() if "-m pytest" in line]
    assert "configfile: pyproject.toml" in tests_run
    options = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["pytest"]
    assert options["ini_options"] == {
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "python_files": ["tests.py", "test_*.py"],
    }


def test_every_conventions_block_builds_a_matrix_host() -> None:
    labelled = {b.label for b in blocks() if b.conventions and b.label}
    commands = {
        line.strip()
        for b in blocks()
        if b.conventions and b.lang == "sh"
        for line in b.body.splitlines()
        if line.strip()
    }
    assert labelled == hosts.DOC_LABELS
    assert commands == hosts.DOC_COMMANDS
