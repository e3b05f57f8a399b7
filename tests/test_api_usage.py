"""GET tenants/<id>/usage: the pages' figures as JSON, tenant-key scoped."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from tests.api import BASE, client_for, new_key
from tests.pages import usage_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def data() -> None:
    usage_data()


def usage(key: str, tenant: str = "acme", **params: str) -> object:
    return client_for(key).get(f"{BASE}tenants/{tenant}/usage", params)


@pytest.mark.usefixtures("data")
def test_usage_by_end_user_model_and_day() -> None:
    key = new_key("acme")
    by_user = usage(key, group_by="end_user").json()  # type: ignore[attr-defined]
    assert by_user["tenant"] == "acme"
    assert by_user["timezone"] == "Europe/Amsterdam"
    assert by_user["unit"] == "provider_cost"
    amounts = {row["end_user"]: Decimal(row["amount"]) for row in by_user["results"]}
    assert amounts["alice-acme"] == Decimal(18)
    assert amounts["bob-acme"] == Decimal(6)
    assert "zed-beta" not in amounts
    assert by_user["count"] == 4
    assert Decimal(by_user["total"]) == sum(amounts.values())
    assert by_user["results"][0]["end_user"] == "alice-acme"  # largest first

    by_model = usage(key, group_by="model").json()  # type: ignore[attr-defined]
    assert [(r["provider"], r["model"]) for r in by_model["results"]] == [("fake", "m30")]
    assert Decimal(by_model["results"][0]["amount"]) == Decimal(by_user["total"])
    assert by_model["results"][0]["calls"] == 5

    by_day = usage(key).json()  # type: ignore[attr-defined]
    assert by_day["group_by"] == "day"
    assert len(by_day["results"]) == 1
    assert Decimal(by_day["total"]) == Decimal(by_user["total"])

    mine = usage(key, group_by="model", end_user="alice-acme").json()  # type: ignore[attr-defined]
    assert Decimal(mine["total"]) == Decimal(18)
    nobody = usage(key, end_user="never-seen").json()  # type: ignore[attr-defined]
    assert (nobody["count"], Decimal(nobody["total"])) == (0, 0)


@pytest.mark.usefixtures("data")
def test_pages_of_end_users() -> None:
    key = new_key("acme")
    first = usage(key, group_by="end_user", limit="2").json()  # type: ignore[attr-defined]
    assert len(first["results"]) == 2
    assert first["next"] is not None
    assert first["count"] == 4
    rest = usage(key, group_by="end_user", limit="2", offset="2").json()  # type: ignore[attr-defined]
    names = {r["end_user"] for r in first["results"] + rest["results"]}
    assert len(names) == 4


@pytest.mark.usefixtures("data")
def test_a_tenant_key_cannot_read_another_tenant() -> None:
    acme = new_key("acme")
    response = usage(acme, tenant="beta", group_by="end_user")
    assert response.status_code == 404  # type: ignore[attr-defined]
    assert "zed-beta" not in response.content.decode()  # type: ignore[attr-defined]
    missing = usage(acme, tenant="no-such-tenant")
    assert missing.status_code == 404  # type: ignore[attr-defined]
    assert missing.json()["error"]["code"] == response.json()["error"]["code"]  # type: ignore[attr-defined]
    # An operator key reads any tenant.
    beta = usage(new_key(), tenant="beta", group_by="end_user").json()  # type: ignore[attr-defined]
    assert [r["end_user"] for r in beta["results"]] == ["zed-beta"]


@pytest.mark.usefixtures("data")
def test_bad_parameters_are_named() -> None:
    key = new_key("acme")
    bad = usage(key, group_by="week")
    assert bad.status_code == 400  # type: ignore[attr-defined]
    assert "group_by" in bad.json()["error"]["fields"]  # type: ignore[attr-defined]
    reversed_range = usage(key, start="2026-02-02", end="2026-02-01")
    assert reversed_range.status_code == 400  # type: ignore[attr-defined]
    assert "end" in reversed_range.json()["error"]["fields"]  # type: ignore[attr-defined]
    typo = usage(key, grup_by="day")
    assert typo.status_code == 400  # type: ignore[attr-defined]
    old = usage(key, start="2000-01-01", end="2000-12-31").json()  # type: ignore[attr-defined]
    assert old["results"] == []
    today = timezone.now().date().isoformat()
    assert usage(key, start="2000-01-01", end=today).status_code == 200  # type: ignore[attr-defined]


def test_the_endpoint_is_in_the_schema() -> None:
    from drf_spectacular.generators import SchemaGenerator

    from llm_budgets.api.schema import own_schema

    with own_schema():  # as the app's schema view builds it (a host's generator leaves it out)
        schema = SchemaGenerator(urlconf="llm_budgets.api.urls").get_schema(
            request=None, public=True
        )
    operation = schema["paths"]["/tenants/{external_id}/usage"]["get"]
    assert operation["operationId"] == "tenants_usage"
    names = {p["name"] for p in operation["parameters"]}
    assert {"group_by", "start", "end", "end_user", "limit", "offset"} <= names
