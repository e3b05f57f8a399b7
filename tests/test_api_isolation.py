"""REST API isolation matrix: tenant A's key against each of tenant B's objects is always a 404
that looks exactly like a missing object, and changes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from llm_budgets import budgets
from llm_budgets.models import Budget, Counter, Reservation, UsageRecord
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

pytestmark = pytest.mark.django_db

MISSING = "00000000-0000-0000-0000-000000000000"


def mentions_amount(message: str, *amounts: str) -> bool:
    """Whether any of `amounts` stands in `message` as a figure (not as digits of a timestamp)."""
    timeless = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:\d\d|Z)?", "", message)
    return any(re.search(rf"(?<![\d.]){a}(?:\.\d+)?(?![\d])", timeless) for a in amounts)


def snapshot() -> list[Any]:
    return [
        sorted(Reservation.objects.values_list("pk", "state", "expires_at")),
        sorted(Counter.objects.values_list("pk", "spent", "reserved")),
        sorted(Budget.objects.values_list("pk", "limit")),
        UsageRecord.objects.count(),
    ]


Probe = Callable[[Any, str], Any]

PROBES: dict[str, Probe] = {
    "get": lambda c, rid: c.get(f"{BASE}reservations/{rid}"),
    "commit": lambda c, rid: c.post(
        f"{BASE}reservations/{rid}/commit", {"input_tokens": 0, "output_tokens": 1}, "json"
    ),
    "release": lambda c, rid: c.post(f"{BASE}reservations/{rid}/release"),
    "extend": lambda c, rid: c.post(
        f"{BASE}reservations/{rid}/extend", {"ttl_seconds": 999}, "json"
    ),
    "uncertain": lambda c, rid: c.post(f"{BASE}reservations/{rid}/uncertain"),
}


@pytest.fixture
def two_tenants() -> tuple[Any, str]:
    seed(tenant="alpha")
    budgets.ensure_tenant(tenant="beta")
    budgets.set_limit(tenant="beta", amount=Decimal(100), window="month")
    beta = client_for(new_key("beta"))
    beta_hold = beta.post(f"{BASE}reservations", reserve_body(), format="json").json()["id"]
    return client_for(new_key("alpha")), beta_hold


@pytest.mark.parametrize("action", sorted(PROBES))
def test_another_tenants_reservation_looks_missing(
    two_tenants: tuple[Any, str], action: str
) -> None:
    alpha, beta_hold = two_tenants
    before = snapshot()
    theirs = PROBES[action](alpha, beta_hold)
    missing = PROBES[action](alpha, MISSING)
    assert theirs.status_code == 404, theirs.content
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"]
    assert snapshot() == before


def test_another_tenants_status_looks_missing(two_tenants: tuple[Any, str]) -> None:
    alpha, _ = two_tenants
    theirs = alpha.get(f"{BASE}tenants/beta/status")
    missing = alpha.get(f"{BASE}tenants/ghost/status")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"] == "unknown_tenant"
    assert "beta" not in missing.content.decode()


def test_quoting_for_another_tenant_looks_missing(two_tenants: tuple[Any, str]) -> None:
    alpha, _ = two_tenants
    before = snapshot()
    request = {"provider": "fake", "model": "m30", "input_tokens": 0, "max_output_tokens": 1000}
    theirs = alpha.get(f"{BASE}quote", {**request, "tenant": "beta"})
    missing = alpha.get(f"{BASE}quote", {**request, "tenant": "ghost"})
    assert theirs.status_code == missing.status_code == 404, theirs.content
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"] == "unknown_tenant"
    assert "beta" not in missing.content.decode()
    assert snapshot() == before
    own = alpha.get(f"{BASE}quote", {**request, "tenant": "alpha"})
    assert (own.status_code, own.json()["tenant"]) == (200, "alpha")
    implied = alpha.get(f"{BASE}quote", request)
    assert implied.json()["budgets"] == own.json()["budgets"]  # alpha's budgets, never beta's
    assert {d["budget"]["scope_label"] for d in implied.json()["budgets"]} == {"tenant alpha"}


def test_reserving_for_another_tenant_looks_missing(two_tenants: tuple[Any, str]) -> None:
    alpha, _ = two_tenants
    before = snapshot()
    response = alpha.post(f"{BASE}reservations", reserve_body(tenant="beta"), format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_tenant"
    assert snapshot() == before
    own = alpha.post(f"{BASE}reservations", reserve_body(tenant="alpha"), format="json")
    assert own.status_code == 201


def test_budgets_are_not_reachable_with_a_tenant_key(two_tenants: tuple[Any, str]) -> None:
    alpha, _ = two_tenants
    before = snapshot()
    assert alpha.get(f"{BASE}budgets", {"tenant": "beta"}).status_code == 403
    response = alpha.post(
        f"{BASE}budgets", {"tenant": "beta", "window": "month", "amount": "0"}, format="json"
    )
    assert response.status_code == 403
    assert snapshot() == before


def test_idempotency_keys_do_not_leak_across_tenants(two_tenants: tuple[Any, str]) -> None:
    alpha, _ = two_tenants
    beta = client_for(new_key("beta"))
    headers = {"HTTP_IDEMPOTENCY_KEY": "shared"}
    theirs = beta.post(f"{BASE}reservations", reserve_body(), format="json", **headers)
    mine = alpha.post(f"{BASE}reservations", reserve_body(), format="json", **headers)
    assert theirs.status_code == mine.status_code == 201
    assert mine.json()["tenant"] == "alpha"
    assert mine.json()["id"] != theirs.json()["id"]


def test_an_operator_key_reaches_every_tenant(two_tenants: tuple[Any, str]) -> None:
    _, beta_hold = two_tenants
    operator = client_for(new_key(None))
    assert operator.get(f"{BASE}reservations/{beta_hold}").status_code == 200
    assert operator.get(f"{BASE}tenants/beta/status").status_code == 200


# One tenant learns nothing about another through the installation-wide budget (issue 22 item 3).

BIG = {"max_output_tokens": 100_000}  # holds 3000: more than the global cap's 1000


def _alpha_sees(alpha: Any, alpha_hold: str) -> dict[str, Any]:
    """Every read a tenant key makes, and a refusal by the global cap: status and body."""
    request = {"provider": "fake", "model": "m30", "input_tokens": 0, "max_output_tokens": 1000}
    answers = {
        "status": alpha.get(f"{BASE}tenants/alpha/status"),
        "status_end_user": alpha.get(f"{BASE}tenants/alpha/status", {"end_user": "u-1"}),
        "quote": alpha.get(f"{BASE}quote", request),
        "quote_refused": alpha.get(f"{BASE}quote", {**request, **BIG}),
        "usage": alpha.get(f"{BASE}tenants/alpha/usage"),
        "reservation": alpha.get(f"{BASE}reservations/{alpha_hold}"),
        "refusal": alpha.post(f"{BASE}reservations", reserve_body(**BIG), format="json"),
    }
    return {name: (r.status_code, r.json()) for name, r in answers.items()}


@pytest.fixture
def global_cap() -> tuple[Any, str, Any]:
    """alpha (cap 5000) and beta (cap 100) under a global cap of 1000; alpha holds 30."""
    seed(tenant="alpha", limit="5000")
    seed(tenant="beta", limit="100")
    budgets.set_limit(amount=Decimal(1000), window="month")
    alpha = client_for(new_key("alpha"))
    hold = alpha.post(f"{BASE}reservations", reserve_body(), format="json").json()["id"]
    return alpha, hold, client_for(new_key("beta"))


def test_another_tenants_activity_changes_nothing_a_tenant_key_reads(
    global_cap: tuple[Any, str, Any],
) -> None:
    alpha, alpha_hold, beta = global_cap
    before = _alpha_sees(alpha, alpha_hold)
    assert before["refusal"][0] == 429, before["refusal"]
    assert before["quote_refused"][1]["admissible"] is False  # that it would refuse: yes
    assert before["quote"][1]["admissible"] is True
    # beta spends 7, holds 30 more, and is refused by its own cap.
    held = beta.post(f"{BASE}reservations", reserve_body(), format="json").json()["id"]
    commit = {"input_tokens": 0, "output_tokens": 233}
    assert beta.post(f"{BASE}reservations/{held}/commit", commit, format="json").status_code == 200
    assert beta.post(f"{BASE}reservations", reserve_body(), format="json").status_code == 201
    assert beta.post(f"{BASE}reservations", reserve_body(**BIG), format="json").status_code == 429
    assert _alpha_sees(alpha, alpha_hold) == before


def test_a_tenant_key_never_sees_the_global_caps_figures(
    global_cap: tuple[Any, str, Any],
) -> None:
    alpha, _, _ = global_cap
    scopes = {b["scope"] for b in alpha.get(f"{BASE}tenants/alpha/status").json()["budgets"]}
    assert scopes == {"tenant"}
    quoted = alpha.get(
        f"{BASE}quote", {"provider": "fake", "model": "m30", "input_tokens": 0, **BIG}
    ).json()
    assert [d["budget"]["scope"] for d in quoted["budgets"]] == ["tenant"]
    assert quoted["budgets"][0]["fits"] is True
    assert quoted["admissible"] is False
    refused = alpha.post(f"{BASE}reservations", reserve_body(**BIG), format="json")
    error = refused.json()["error"]
    assert error["budget"]["scope"] == "global"
    assert error["budget"]["limit"] is error["budget"]["remaining"] is error["budget"]["id"] is None
    assert not mentions_amount(error["message"], "1000", "970")
    assert int(refused["Retry-After"]) >= 1


def test_an_operator_key_still_sees_the_global_caps_figures(
    global_cap: tuple[Any, str, Any],
) -> None:
    operator = client_for(new_key(None))
    status = operator.get(f"{BASE}tenants/alpha/status").json()["budgets"]
    shared = next(b for b in status if b["scope"] == "global")
    assert (shared["limit"], shared["reserved"]) == ("1000", "30")
    refused = operator.post(
        f"{BASE}reservations", reserve_body(tenant="alpha", **BIG), format="json"
    ).json()["error"]
    assert (refused["budget"]["limit"], refused["budget"]["remaining"]) == ("1000", "970")


def test_a_rolling_global_refusal_tells_a_tenant_only_a_bound() -> None:
    seed(tenant="alpha", limit="5000")
    seed(tenant="beta", limit="5000")
    budgets.set_limit(amount=Decimal(100), window="rolling:1h")
    beta = client_for(new_key("beta"))
    assert beta.post(f"{BASE}reservations", reserve_body(), format="json").status_code == 201
    refused = client_for(new_key("alpha")).post(
        f"{BASE}reservations", reserve_body(max_output_tokens=3000), format="json"
    )
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["budget"]["limit"] is error["budget"]["remaining"] is None
    assert not mentions_amount(error["message"], "100", "70")
    assert 3600 <= int(refused["Retry-After"]) <= 3600 + 3600
