"""Moved: the fake servers ship in the package, ``llm_budgets.testing.fakes`` (docs/testing.md).
These modules re-export them for code that still imports ``tests.fakes``."""
