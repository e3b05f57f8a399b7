"""The host with ATOMIC_REQUESTS, strict DRF defaults, and its own admin-only drf-spectacular
schema at /api/schema/."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from tests.conftest import client_for, make_user


def test_every_request_runs_in_a_transaction() -> None:
    assert connection.settings_dict["ATOMIC_REQUESTS"] is True


@pytest.mark.django_db
def test_the_hosts_own_api_keeps_its_strict_defaults() -> None:
    assert Client().get("/api/ping/").status_code == 403
    assert Client().get("/api/schema/").status_code == 403
    assert client_for(make_user("root", superuser=True)).get("/api/ping/").json() == {"pong": True}


@pytest.mark.django_db
def test_the_hosts_schema_lists_only_the_hosts_paths() -> None:
    response = client_for(make_user("root", superuser=True)).get("/api/schema/?format=json")
    assert response.status_code == 200
    # Its own two endpoints and the schema view itself (drf-spectacular's SERVE_INCLUDE_SCHEMA).
    assert sorted(response.json()["paths"]) == ["/api/me/", "/api/ping/", "/api/schema/"]


@pytest.mark.django_db
def test_the_apps_own_docs_are_for_staff_like_the_hosts() -> None:
    staff = client_for(make_user("reader", is_staff=True))
    for url in ("/api/llm-budgets/v1/schema/", "/api/llm-budgets/v1/docs/"):
        assert Client().get(url).status_code == 403, url
        assert staff.get(url).status_code == 200, url
