"""Moved to :mod:`llm_budgets.billing.totals` (this path warns, and goes in the next release)."""

from llm_budgets.moved import alias_moved

alias_moved(__name__)
