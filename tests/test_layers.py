"""The package reads downward only: every module of ``llm_budgets`` sits on one layer, imports only
from its own layer or below, and no group of modules imports itself round in a circle.

Every import counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): an import deferred into a function is still a dependency, and hiding one there
is how the cycles this test replaced came about. docs/architecture.md draws the same layers from
``LAYERS`` below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llm_budgets"

# Bottom to top. A module belongs to the first entry that names it or a package above it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation",
        [
            "llm_budgets",  # the package's face: its version, nothing else
            "llm_budgets.conf",
            "llm_budgets.money",
            "llm_budgets.clock",
            "llm_budgets.exceptions",
            "llm_budgets.results",
            "llm_budgets.validation",
            "llm_budgets.signals",
            "llm_budgets.roles",
            "llm_budgets.usage",
            "llm_budgets.request",
            "llm_budgets.holds",
            "llm_budgets.tags",
            "llm_budgets.windows",
            "llm_budgets.degradation",
            "llm_budgets.schedule",
            "llm_budgets.routers",
            "llm_budgets.host_users",
            "llm_budgets.moved",
            "llm_budgets.db",
            "llm_budgets.alerts",  # its face (verify) and the pure parts: bodies, signing
        ],
    ),
    ("models", ["llm_budgets.models"]),
    (
        "domain",
        [
            "llm_budgets.pricing",
            "llm_budgets.tenancy",
            "llm_budgets.control",
            "llm_budgets.events",
            "llm_budgets.metrics",
            "llm_budgets.logformat",
            "llm_budgets.hooks",  # where optional parts meet the ledger
            "llm_budgets.alerts.emit",
            "llm_budgets.alerts.endpoints",
            "llm_budgets.alerts.ledger_hooks",
            "llm_budgets.alerts.self_serve",
        ],
    ),
    ("engine", ["llm_budgets.engine"]),
    (
        "reads and jobs",
        [
            "llm_budgets.reads",
            "llm_budgets.jobs",
            "llm_budgets.billing",
            "llm_budgets.health",
            "llm_budgets.alerts.delivery",
            "llm_budgets.alerts.formats",
            "llm_budgets.alerts.transport",
        ],
    ),
    (
        "surfaces",
        [
            "llm_budgets.budgets",
            "llm_budgets.client",
            "llm_budgets.api",
            "llm_budgets.admin",
            "llm_budgets.pages",
            "llm_budgets.integrations",
            "llm_budgets.tasks",
            "llm_budgets.checks",
            "llm_budgets.billing.checks",  # system checks, beside llm_budgets.checks
            "llm_budgets.alerts.checks",
            "llm_budgets.alerts.views",  # the page an email confirmation link opens
            "llm_budgets.apps",
            "llm_budgets.celery_worker",
            "llm_budgets.management",
            "llm_budgets.templatetags",
            "llm_budgets.testing",
            "llm_budgets.model_names",  # moved to pricing.model_names: an alias for one release
        ],
    ),
]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if name == "llm_budgets" and module != name:
                    continue
                if best is None or len(name) > best[0]:
                    best = (len(name), index)
    return None if best is None else best[1]


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """The package's modules ``module`` imports, with the line of each import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from pkg import mod`` imports the module ``pkg.mod``; ``from mod import name``, mod.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("llm_budgets"):
                yield name, node.lineno


def graph() -> dict[str, set[str]]:
    return {m: {name for name, _ in imported(m, p)} for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, f"Place these modules on a layer in tests/test_layers.py: {unplaced}"


def test_no_import_runs_upward() -> None:
    upward = []
    for module, path in sorted(MODULES.items()):
        own = layer_of(module)
        for name, line in sorted(set(imported(module, path))):
            theirs = layer_of(name)
            if own is not None and theirs is not None and theirs > own:
                upward.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line} {module} ({LAYERS[own][0]}) "
                    f"imports {name} ({LAYERS[theirs][0]})"
                )
    assert not upward, "Imports that run upward:\n" + "\n".join(upward)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected


def test_the_layer_check_sees_a_deferred_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from llm_budgets.engine import admission\n")
    assert [name for name, _ in imported("llm_budgets.money", source)] == [
        "llm_budgets.engine.admission"
    ]
    assert layer_of("llm_budgets.engine.admission") > layer_of("llm_budgets.money")  # type: ignore[operator]
