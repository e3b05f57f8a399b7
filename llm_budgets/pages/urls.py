"""Mount with ``path("usage/", include("llm_budgets.pages.urls"))`` (docs/pages.md)."""

from __future__ import annotations

from django.urls import path

from llm_budgets.pages import balance, manage, views

app_name = "llm_budgets_pages"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("models/", views.models, name="models"),
    path("users/", views.users, name="users"),
    path("refusals/", views.refusals, name="refusals"),
    path("export.csv", views.export_csv, name="export"),
    path("tenants/", views.tenants, name="tenants"),
    # A tenant admin's forms (self-serve; docs/pages.md, "Tenant admins act").
    path("manage/", manage.manage, name="manage"),
    path("manage/budgets/set/", manage.budget_set, name="budget_set"),
    path("manage/budgets/<int:pk>/remove/", manage.budget_remove_view, name="budget_remove"),
    path("manage/raises/grant/", manage.raise_grant, name="raise_grant"),
    path("manage/raises/<int:pk>/revoke/", manage.raise_revoke, name="raise_revoke"),
    path("manage/users/reset/", manage.spend_reset, name="spend_reset"),
    path("manage/keys/create/", manage.key_create, name="key_create"),
    path("manage/keys/<str:pk>/revoke/", manage.key_revoke, name="key_revoke"),
    path("manage/alerts/subscribe/", manage.alert_subscribe, name="alert_subscribe"),
    path("manage/alerts/<int:pk>/remove/", manage.alert_remove, name="alert_remove"),
    path("balance/", balance.balance, name="balance"),
    path("balance/top-up", balance.top_up, name="balance_top_up"),
]
