"""The documented REST API's routes (what the OpenAPI schema describes); ``api.urls`` mounts them
beside the webhook, the schema and the docs."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from llm_budgets.api import alerts, balances, health, killswitches, self_serve, usage, views

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
    path(
        "tenants/<path:external_id>/balance",
        balances.TenantBalanceView.as_view(),
        name="tenant-balance",
    ),
    path(
        "tenants/<path:external_id>/top-ups",
        balances.TenantTopUpView.as_view(),
        name="tenant-top-ups",
    ),
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
    path("alerts/endpoints", alerts.AlertEndpointListView.as_view(), name="alert-endpoints"),
    path(
        "alerts/endpoints/<str:endpoint_id>",
        alerts.AlertEndpointDetailView.as_view(),
        name="alert-endpoint",
    ),
    path(
        "alerts/endpoints/<str:endpoint_id>/rotate-secret",
        alerts.AlertEndpointRotateView.as_view(),
        name="alert-endpoint-rotate-secret",
    ),
    path(
        "alerts/endpoints/<str:endpoint_id>/test",
        alerts.AlertEndpointTestView.as_view(),
        name="alert-endpoint-test",
    ),
    path(
        "alerts/endpoints/<str:endpoint_id>/disable",
        alerts.AlertEndpointDisableView.as_view(),
        name="alert-endpoint-disable",
    ),
    path(
        "alerts/endpoints/<str:endpoint_id>/enable",
        alerts.AlertEndpointEnableView.as_view(),
        name="alert-endpoint-enable",
    ),
    path("alerts/deliveries", alerts.AlertDeliveryListView.as_view(), name="alert-deliveries"),
    path(
        "alerts/deliveries/<str:delivery_id>",
        alerts.AlertDeliveryDetailView.as_view(),
        name="alert-delivery",
    ),
    path(
        "alerts/deliveries/<str:delivery_id>/redeliver",
        alerts.AlertDeliveryRedeliverView.as_view(),
        name="alert-delivery-redeliver",
    ),
    path("alerts/events", alerts.AlertEventListView.as_view(), name="alert-events"),
    # Self-serve (tenant keys the operators marked self_serve; docs/api.md#self-serve).
    path("self-serve/budgets", self_serve.SelfServeBudgetsView.as_view(), name="ss-budgets"),
    path(
        "self-serve/budgets/<int:budget_id>/remove",
        self_serve.SelfServeBudgetRemoveView.as_view(),
        name="ss-budget-remove",
    ),
    path("self-serve/raises", self_serve.SelfServeRaisesView.as_view(), name="ss-raises"),
    path(
        "self-serve/raises/<int:raise_id>/revoke",
        self_serve.SelfServeRaiseRevokeView.as_view(),
        name="ss-raise-revoke",
    ),
    path("self-serve/end-users/reset", self_serve.SelfServeResetView.as_view(), name="ss-reset"),
    path("self-serve/api-keys", self_serve.SelfServeKeysView.as_view(), name="ss-keys"),
    path(
        "self-serve/api-keys/<str:prefix>/revoke",
        self_serve.SelfServeKeyRevokeView.as_view(),
        name="ss-key-revoke",
    ),
    path("health", health.HealthView.as_view(), name="health"),
]
