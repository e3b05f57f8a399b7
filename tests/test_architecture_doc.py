"""docs/architecture.md against the code: its layers are ``LAYERS``, its module table names every
module and nothing that is gone, its list of parity rules is ``RULES``, its moved paths are
``MOVED``, and every function its paths name exists where it says."""

from __future__ import annotations

import re
from pathlib import Path

from llm_budgets.moved import MOVED
from tests.test_layers import LAYERS, PACKAGE
from tests.test_rule_parity import RULES

DOC = (PACKAGE.parent / "docs" / "architecture.md").read_text()


def section(name: str) -> str:
    start = DOC.index(f"<!-- {name}")
    return DOC[DOC.index("\n", start) : DOC.index(f"<!-- /{name} -->")]


def module_of(cell: str) -> str:
    """``db/`` -> ``llm_budgets.db``, ``billing/checks`` -> ``llm_budgets.billing.checks``."""
    if cell == "llm_budgets":
        return cell
    return "llm_budgets." + cell.rstrip("/").replace("/", ".")


def test_the_layers_are_the_ones_the_test_enforces() -> None:
    rows = [line.split("|") for line in section("layers").splitlines() if line.startswith("| ")]
    documented = [
        (cells[1].strip(), {module_of(name) for name in re.findall(r"`([^`]+)`", cells[2])})
        for cells in rows[1:]  # the header row
    ]
    assert documented == [(name, set(modules)) for name, modules in LAYERS]


def module_files() -> set[str]:
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and path.name != "__init__.py"
    }


def test_the_module_table_names_every_module_and_only_real_ones() -> None:
    cells = [
        line.split("|")[1] for line in section("modules").splitlines() if line.startswith("| `")
    ]
    named = [name for cell in cells for name in re.findall(r"`([^`]+)`", cell)]
    missing = [name for name in named if not (PACKAGE / name).exists()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
    unlisted = sorted(
        f
        for f in module_files()
        if not any(f == n or (n.endswith("/") and f.startswith(n)) for n in named)
    )
    assert not unlisted, f"Add these modules to docs/architecture.md's table: {unlisted}"


def test_the_parity_rules_listed_are_the_ones_the_test_guards() -> None:
    listed = dict(re.findall(r"^- (.+): `([^`]+)`$", section("parity rules"), re.M))
    assert listed == {rule: next(iter(owners)) for rule, (owners, _) in RULES.items()}


def test_the_moved_paths_listed_are_the_aliases() -> None:
    listed = dict(re.findall(r"^- `([\w.]+)` → `([\w.]+)`$", section("moved"), re.M))
    assert listed == MOVED


def test_every_function_on_the_paths_exists_where_the_page_says() -> None:
    paths = "".join(re.findall(r"```\n(.*?)```", DOC, re.S))
    named = re.findall(r"\b([a-z_]+(?:/[a-z_]+)+|[a-z_]+)\.([a-z_]\w*)\b", paths)
    checked = 0
    for module, name in named:
        source = PACKAGE / f"{module}.py"
        if name == "py" or not source.exists():
            continue
        text = source.read_text()
        assert re.search(rf"^\s*(def|class) {name}\b|^{name}\s*[:=]", text, re.M), (
            f"docs/architecture.md names {module}.{name}, which {source.name} does not define"
        )
        checked += 1
    assert checked >= 8  # the page's paths still name functions this test can check


def test_the_checks_above_can_fail(tmp_path: Path) -> None:
    assert module_of("billing/checks") == "llm_budgets.billing.checks"
    assert "engine/admission.py" in module_files()
