"""The OpenAPI schema and its Swagger UI page, served from the installed package."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client

from tests.api import BASE

pytestmark = pytest.mark.django_db


def test_the_schema_is_public_and_covers_every_endpoint() -> None:
    response = Client().get(f"{BASE}schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "llm_budgets API"
    assert set(schema["paths"]) == {
        f"{BASE}{path}"
        for path in [
            "reservations",
            "reservations/{reservation_id}",
            "reservations/{reservation_id}/commit",
            "reservations/{reservation_id}/release",
            "reservations/{reservation_id}/extend",
            "reservations/{reservation_id}/uncertain",
            "tenants/{external_id}/status",
            "tenants/{external_id}/usage",
            "tenants/{external_id}/balance",
            "tenants/{external_id}/top-ups",
            "quote",
            "runs/close",
            "prices",
            "budgets",
            "kill-switches",
            "kill-switches/clear",
            "alerts/endpoints",
            "alerts/endpoints/{endpoint_id}",
            "alerts/endpoints/{endpoint_id}/rotate-secret",
            "alerts/endpoints/{endpoint_id}/test",
            "alerts/endpoints/{endpoint_id}/disable",
            "alerts/endpoints/{endpoint_id}/enable",
            "alerts/deliveries",
            "alerts/deliveries/{delivery_id}",
            "alerts/deliveries/{delivery_id}/redeliver",
            "alerts/events",
            "self-serve/budgets",
            "self-serve/budgets/{budget_id}/remove",
            "self-serve/raises",
            "self-serve/raises/{raise_id}/revoke",
            "self-serve/end-users/reset",
            "self-serve/api-keys",
            "self-serve/api-keys/{prefix}/revoke",
            "health",
        ]
    }
    assert schema["components"]["securitySchemes"]["ApiKey"]["name"] == "Authorization"
    create = schema["paths"][f"{BASE}reservations"]["post"]
    assert {"201", "400", "401", "403", "404", "409", "422", "429", "503"} <= set(
        create["responses"]
    )
    assert "Idempotency-Key" in {p["name"] for p in create["parameters"]}
    quote = schema["paths"][f"{BASE}quote"]["get"]
    assert {"200", "400", "401", "404", "422", "503"} <= set(quote["responses"])
    assert {"tenant", "model", "input_tokens", "messages", "prompt", "max_output_tokens"} <= {
        p["name"] for p in quote["parameters"]
    }


def test_the_schema_validates_without_warnings(settings: Any) -> None:
    # `manage.py spectacular` is a host's generator: the app's endpoints are in it only on request.
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "API_DOCS_IN_HOST_SCHEMA": True}
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_swagger_ui_loads_its_assets_from_the_installed_package() -> None:
    response = Client().get(f"{BASE}docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("swagger-ui-bundle.js" in a for a in assets), assets
    for asset in assets:
        assert not asset.startswith(("http:", "https:", "//")), asset
    # A CDN named anywhere (a script's URL built in code, say); not "cdn" inside the page's
    # random CSRF token, which has it about once in 750 pages.
    assert not re.search(r"\bcdn\b|cdn\.|cdnjs|jsdelivr|unpkg", html.lower()), html
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "swagger-ui-standalone-preset.js"):
        assert finders.find(f"drf_spectacular_sidecar/swagger-ui-dist/{name}"), name


def test_the_schema_is_built_once_per_process_and_served_in_each_format() -> None:
    from llm_budgets.api import docs

    docs._SCHEMAS.clear()
    first = Client().get(f"{BASE}schema/", {"format": "json"})
    again = Client().get(f"{BASE}schema/", {"format": "json"})
    yaml = Client().get(f"{BASE}schema/")
    assert first.content == again.content
    assert first["Content-Type"].startswith("application/vnd.oai.openapi+json")
    assert yaml["Content-Type"].startswith("application/vnd.oai.openapi")
    assert yaml.content.startswith(b"openapi: 3.")
    assert len(docs._SCHEMAS) == 2
