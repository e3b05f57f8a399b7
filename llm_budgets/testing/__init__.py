"""A kit for a host project's own tests (docs/testing.md).

- :func:`application_clock`: admission follows this process's clock, so ``freezegun`` and
  ``time_machine`` move it too (by default admission reads the database's clock).
- :func:`setup_budgets`: prices, tenants and their budgets in one call.
- :mod:`llm_budgets.testing.fakes`: fake OpenAI, Anthropic and Stripe servers.
- :mod:`llm_budgets.testing.faultproxy`: a TCP proxy that injects network faults (latency,
  stalls, resets, outages, a cut at the n-th message) between the app and a server.
- :func:`llm_budgets.testing.queries.round_trips`: the statements a block sends, by round trip.
- ``pytest_plugins = ["llm_budgets.testing.pytest"]``: the same as pytest fixtures.

Nothing here imports pytest (only ``llm_budgets.testing.pytest`` does), and nothing in the app
imports this package. The names below are imported on first use, so the fault proxy imports
without a configured Django (a script that drives Redis, say).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_budgets.testing.clock import application_clock
    from llm_budgets.testing.setup import PRICES, PRICES_FROM, Seeded, setup_budgets

__all__ = ["PRICES", "PRICES_FROM", "Seeded", "application_clock", "setup_budgets"]

_HOMES = {
    "application_clock": "llm_budgets.testing.clock",
    "PRICES": "llm_budgets.testing.setup",
    "PRICES_FROM": "llm_budgets.testing.setup",
    "Seeded": "llm_budgets.testing.setup",
    "setup_budgets": "llm_budgets.testing.setup",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
