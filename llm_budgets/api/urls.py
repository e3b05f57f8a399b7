"""Mount with ``path("api/llm-budgets/v1/", include("llm_budgets.api.urls"))``."""

from __future__ import annotations

from django.urls import path, re_path

from llm_budgets.alerts.views import email_confirm
from llm_budgets.api import docs, views
from llm_budgets.api.routes import api_patterns
from llm_budgets.billing.views import stripe_webhook

app_name = "llm_budgets_api"

urlpatterns = [
    *api_patterns,
    # Outside the documented REST API: no API key, Stripe's signature authenticates.
    path("stripe/webhook", views.no_store(stripe_webhook), name="stripe-webhook"),
    # The link an email address a tenant added is sent: no API key, the signature authenticates.
    path(
        "alerts/confirm/<str:token>",
        views.no_store(email_confirm),
        name="alert-email-confirm",
    ),
    path(docs.SCHEMA_PATH, docs.SchemaView.as_view(), name="schema"),
    path("docs/", docs.SwaggerView.as_view(), name="docs"),
    # Any other path, newlines included, gets a JSON 404.
    re_path(r"^[\s\S]*$", views.NotFoundView.as_view(), name="not-found"),
]
