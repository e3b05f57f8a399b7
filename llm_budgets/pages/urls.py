"""Mount with ``path("usage/", include("llm_budgets.pages.urls"))`` (docs/pages.md)."""

from __future__ import annotations

from django.urls import path

from llm_budgets.pages import balance, views

app_name = "llm_budgets_pages"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("models/", views.models, name="models"),
    path("users/", views.users, name="users"),
    path("refusals/", views.refusals, name="refusals"),
    path("export.csv", views.export_csv, name="export"),
    path("tenants/", views.tenants, name="tenants"),
    path("balance/", balance.balance, name="balance"),
    path("balance/top-up", balance.top_up, name="balance_top_up"),
]
