"""Hard LLM spending limits for multi-tenant Django projects.

The public Python API lives in :mod:`llm_budgets.budgets`::

    from llm_budgets import budgets
"""

__version__ = "0.1.0.dev0"
