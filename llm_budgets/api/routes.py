"""The documented REST API's routes (what the OpenAPI schema describes); ``api.urls`` mounts them
beside the webhook, the schema and the docs."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from llm_budgets.api import health, killswitches, usage, views

api_patterns: list[URLPattern | URLResolver] = [
    path("reservations", views.ReservationCreateView.as_view(), name="reservations"),
    path(
        "reservations/<str:reservation_id>",
        views.ReservationDetailView.as_view(),
        name="reservation",
    ),
    path(
        "reservations/<str:reservation_id>/commit",
        views.ReservationCommitView.as_view(),
        name="reservation-commit",
    ),
    path(
        "reservations/<str:reservation_id>/release",
        views.ReservationReleaseView.as_view(),
        name="reservation-release",
    ),
    path(
        "reservations/<str:reservation_id>/extend",
        views.ReservationExtendView.as_view(),
        name="reservation-extend",
    ),
    path(
        "reservations/<str:reservation_id>/uncertain",
        views.ReservationUncertainView.as_view(),
        name="reservation-uncertain",
    ),
    path(
        "tenants/<path:external_id>/status", views.TenantStatusView.as_view(), name="tenant-status"
    ),
    path("tenants/<path:external_id>/usage", usage.TenantUsageView.as_view(), name="tenant-usage"),
    path("quote", views.QuoteView.as_view(), name="quote"),
    path("runs/close", views.RunCloseView.as_view(), name="run-close"),
    path("prices", views.PriceListView.as_view(), name="prices"),
    path("budgets", views.BudgetListView.as_view(), name="budgets"),
    path("kill-switches", killswitches.KillSwitchListView.as_view(), name="kill-switches"),
    path(
        "kill-switches/clear",
        killswitches.KillSwitchClearView.as_view(),
        name="kill-switches-clear",
    ),
    path("health", health.HealthView.as_view(), name="health"),
]
