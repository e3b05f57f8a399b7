"""Tenant-facing usage pages a host mounts in its own product (docs/pages.md).

Mount ``path("usage/", include("llm_budgets.pages.urls"))``; who sees which tenant is decided by
``LLM_BUDGETS["TENANT_RESOLVER"]`` (:mod:`llm_budgets.pages.access`).
"""
