"""Import paths that moved: the old path stays an alias of the new module for one release, with a
``DeprecationWarning`` that names where to import from (docs/architecture.md lists them)."""

from __future__ import annotations

import importlib
import sys
import warnings

# Old path -> new path, for the paths the docs once gave hosts.
MOVED = {
    "llm_budgets.model_names": "llm_budgets.pricing.model_names",
    "llm_budgets.billing.selectors": "llm_budgets.billing.totals",
}


def alias_moved(old: str) -> None:
    """Make ``old`` (the module being imported) the module it moved to, and warn its importer."""
    new = MOVED[old]
    warnings.warn(
        f"{old} moved to {new}; import from there (the old path goes in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )
    # The import system hands back whatever sys.modules holds once the old module has run:
    # the new module itself, so patches and identity checks through either path agree.
    sys.modules[old] = importlib.import_module(new)
