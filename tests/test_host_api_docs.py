"""The app's API docs beside a host's own (issue 23): the app's endpoints stay out of the host's
generated schema by default, and its own schema and Swagger page follow ``API_DOCS_ACCESS``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tests.api import BASE

pytestmark = pytest.mark.django_db


class HostPing(APIView):
    """One endpoint of the host's own API."""

    permission_classes = [AllowAny]
    schema = AutoSchema()

    def get(self, request: Request) -> Response:
        return Response({"pong": True})


HOST_PATTERNS = [
    path("api/ping", HostPing.as_view()),
    path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
]


def _host_schema_paths() -> set[str]:
    schema = SchemaGenerator(patterns=HOST_PATTERNS).get_schema(request=None, public=True)
    return set(schema["paths"])


def test_the_hosts_schema_leaves_the_apps_endpoints_out() -> None:
    assert _host_schema_paths() == {"/api/ping"}


def test_a_host_may_ask_for_them_in_its_schema() -> None:
    with override_settings(LLM_BUDGETS={"API_DOCS_IN_HOST_SCHEMA": True}):
        paths = _host_schema_paths()
    assert "/api/ping" in paths
    assert f"{BASE}reservations" in paths
    assert f"{BASE}kill-switches/clear" in paths


def test_the_apps_own_schema_still_has_them_after_a_host_schema_was_built() -> None:
    from llm_budgets.api import docs

    _host_schema_paths()
    docs._SCHEMAS.clear()
    schema = Client().get(f"{BASE}schema/", {"format": "json"}).json()
    assert f"{BASE}reservations" in schema["paths"]
    assert "/api/ping" not in schema["paths"]


def _client(**user: Any) -> Client:
    client = Client()
    if user:
        client.force_login(get_user_model().objects.create_user(password=None, **user))
    return client


@pytest.mark.parametrize("page", ["schema/", "docs/"])
def test_by_default_the_docs_are_for_staff(page: str) -> None:
    url = f"{BASE}{page}"
    with override_settings(LLM_BUDGETS={}):  # the default
        assert _client().get(url).status_code == 403
        assert _client(username="customer").get(url).status_code == 403
        assert _client(username="ops", is_staff=True).get(url).status_code == 200
    with override_settings(LLM_BUDGETS={"API_DOCS_ACCESS": "public"}):
        assert _client().get(url).status_code == 200
    with override_settings(LLM_BUDGETS={"API_DOCS_ACCESS": "off"}):
        assert _client(username="root", is_staff=True).get(url).status_code == 404
