"""A kit for a host project's own tests (docs/testing.md).

- :func:`application_clock`: admission follows this process's clock, so ``freezegun`` and
  ``time_machine`` move it too (by default admission reads the database's clock).
- :func:`setup_budgets`: prices, tenants and their budgets in one call.
- :mod:`llm_budgets.testing.fakes`: fake OpenAI, Anthropic and Stripe servers.
- ``pytest_plugins = ["llm_budgets.testing.pytest"]``: the same as pytest fixtures.

Nothing here imports pytest (only ``llm_budgets.testing.pytest`` does), and nothing in the app
imports this package.
"""

from llm_budgets.testing.clock import application_clock
from llm_budgets.testing.setup import PRICES, PRICES_FROM, Seeded, setup_budgets

__all__ = ["PRICES", "PRICES_FROM", "Seeded", "application_clock", "setup_budgets"]
