"""Moved to :mod:`llm_budgets.pricing.model_names` (this path warns; it goes in the next
release)."""

from llm_budgets.moved import alias_moved

alias_moved(__name__)
