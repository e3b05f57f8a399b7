"""The app's start-up (``llm_budgets/apps.py``): receivers are connected in ``ready()``, never
by importing a module, so what the app listens to follows from its being installed and started."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "llm_budgets"


def connected_at_import(path: Path) -> list[int]:
    """Lines of ``path`` that call ``.connect(`` outside any function or class body."""
    tree = ast.parse(path.read_text(), str(path))
    inside = {
        id(node)
        for top in tree.body
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for node in ast.walk(top)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "connect"
        and id(node) not in inside
    ]


def test_no_module_connects_a_receiver_at_import() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in connected_at_import(path)
    ]
    assert not found, f"Connect these in LlmBudgetsConfig.ready(): {found}"
