"""REST API for [control]: kill switch endpoints (operator keys), the 403 a switch causes over
HTTP, switches on one API key, and allow_degrade on POST /reservations."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.models import ApiKey, AuditEvent, KillSwitch, Refusal, Reservation
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import FAKE_MODEL, reserve_30, seed
from tests.test_degradation import CHEAP, _setup

pytestmark = pytest.mark.django_db

SWITCHES = f"{BASE}kill-switches"


def prefix_of(key: str) -> str:
    return key.partition(".")[0]


@pytest.fixture
def keys() -> dict[str, str]:
    seed(limit="100")
    return {"operator": new_key(None, name="ops"), "acme": new_key("acme", name="acme-app")}


def trip(key: str, **body: Any) -> Any:
    body.setdefault("reason", "runaway agent loop")
    return client_for(key).post(SWITCHES, body, format="json")


def clear(key: str, **body: Any) -> Any:
    body.setdefault("reason", "fixed the loop")
    return client_for(key).post(f"{SWITCHES}/clear", body, format="json")


def reserve(key: str, **overrides: Any) -> Any:
    return client_for(key).post(f"{BASE}reservations", reserve_body(**overrides), format="json")


def error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_a_trip_refuses_the_next_reservation_with_403_naming_reason_and_who(
    keys: dict[str, str],
) -> None:
    response = trip(keys["operator"], tenant="acme", model=FAKE_MODEL)
    assert response.status_code == 201, response.content
    switch = response.json()
    actor = f"api-key:{prefix_of(keys['operator'])} (ops)"
    assert switch["scope"] == f"tenant acme, model {FAKE_MODEL}"
    assert (switch["tenant"], switch["model"], switch["provider"]) == ("acme", FAKE_MODEL, "")
    assert (switch["end_user"], switch["api_key"]) == (None, None)
    assert switch["active"] is True
    assert switch["reason"] == "runaway agent loop"
    assert switch["tripped_by"] == actor
    assert switch["automatic"] is False

    refused = reserve(keys["acme"])
    assert refused.status_code == 403
    body = error(refused)
    assert body["code"] == "kill_switch_active"
    assert body["reason"] == "runaway agent loop"
    assert body["tripped_by"] == actor
    assert body["switch_id"] == switch["id"]
    assert body["scope"] == f"tenant acme, model {FAKE_MODEL}"
    assert body["automatic"] is False
    assert "runaway agent loop" in body["message"]
    assert actor in body["message"]
    assert not Reservation.objects.exists()
    assert Refusal.objects.get().kill_switch_id == switch["id"]


def test_trip_and_clear_are_audited_with_the_key_as_actor(keys: dict[str, str]) -> None:
    actor = f"api-key:{prefix_of(keys['operator'])} (ops)"
    assert trip(keys["operator"], tenant="acme").status_code == 201
    response = clear(keys["operator"], tenant="acme")
    assert response.status_code == 200, response.content
    cleared = response.json()
    assert cleared["active"] is False
    assert (cleared["cleared_by"], cleared["clear_reason"]) == (actor, "fixed the loop")
    events = AuditEvent.objects.filter(action__startswith="kill_switch.").order_by("pk")
    assert [(e.action, e.actor, e.reason) for e in events] == [
        ("kill_switch.trip", actor, "runaway agent loop"),
        ("kill_switch.clear", actor, "fixed the loop"),
    ]
    assert reserve(keys["acme"]).status_code == 201


def test_tripping_a_tripped_scope_returns_the_open_switch_with_200(
    keys: dict[str, str],
) -> None:
    first = trip(keys["operator"], provider="fake")
    again = trip(keys["operator"], provider="fake", reason="another reason")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["reason"] == "runaway agent loop"
    assert KillSwitch.objects.count() == 1


def test_no_scope_is_global(keys: dict[str, str]) -> None:
    assert trip(keys["operator"]).json()["scope"] == "global"
    assert reserve(keys["acme"]).status_code == 403
    assert clear(keys["operator"]).status_code == 200
    assert reserve(keys["acme"]).status_code == 201


def test_a_replayed_trip_is_the_first_response(keys: dict[str, str]) -> None:
    client = client_for(keys["operator"])
    body = {"tenant": "acme", "reason": "r"}
    first = client.post(SWITCHES, body, format="json", HTTP_IDEMPOTENCY_KEY="trip-1")
    replay = client.post(SWITCHES, body, format="json", HTTP_IDEMPOTENCY_KEY="trip-1")
    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()


def test_tenant_keys_get_403_and_change_nothing(keys: dict[str, str]) -> None:
    budgets.trip(tenant="acme", reason="by staff")
    tenant = client_for(keys["acme"])
    responses = [
        tenant.get(SWITCHES),
        trip(keys["acme"], tenant="acme"),
        clear(keys["acme"], tenant="acme"),
    ]
    for response in responses:
        assert response.status_code == 403, response.content
        assert error(response)["code"] == "operator_key_required"
    switch = KillSwitch.objects.get()
    assert switch.cleared_at is None
    assert not AuditEvent.objects.filter(actor__startswith="api-key:").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": "acme"}, "reason"),
        ({"tenant": "acme", "reason": "   "}, "reason"),
        ({"end_user": "u-1", "reason": "r"}, "tenant"),
        ({"api_key": "nope", "reason": "r"}, "api_key"),
        ({"model": "", "reason": "r"}, "model"),
        ({"tenant": "acme", "reason": "r", "colour": "red"}, "colour"),
        ({"reason": "r", "auto_clear_at": "2000-01-01T00:00:00Z"}, "auto_clear_at"),
    ],
)
def test_bad_trips_are_400_naming_the_field(
    keys: dict[str, str], body: dict[str, Any], field: str
) -> None:
    response = client_for(keys["operator"]).post(SWITCHES, body, format="json")
    assert response.status_code == 400, response.content
    assert field in error(response)["fields"], error(response)
    assert not KillSwitch.objects.exists()


def test_an_unknown_tenant_is_404(keys: dict[str, str]) -> None:
    response = trip(keys["operator"], tenant="nobody")
    assert response.status_code == 404
    assert error(response)["code"] == "unknown_tenant"


def test_clear_needs_a_switch_on_exactly_that_scope(keys: dict[str, str]) -> None:
    budgets.trip(tenant="acme", model=FAKE_MODEL, reason="r")
    for body in ({"tenant": "acme"}, {"model": FAKE_MODEL}, {"tenant": "acme", "end_user": "x"}):
        response = clear(keys["operator"], **body)
        assert response.status_code == 400, (body, response.content)
        assert error(response)["field"] == "scope"
    assert KillSwitch.objects.get().cleared_at is None
    missing_reason = client_for(keys["operator"]).post(
        f"{SWITCHES}/clear", {"tenant": "acme", "model": FAKE_MODEL}, format="json"
    )
    assert error(missing_reason)["field"] == "reason"
    assert clear(keys["operator"], tenant="acme", model=FAKE_MODEL).status_code == 200


def test_the_list_filters_by_state_and_tenant(keys: dict[str, str]) -> None:
    seed(tenant="globex")
    budgets.trip(tenant="acme", reason="a")
    budgets.trip(tenant="globex", reason="g")
    budgets.trip(model="old", reason="o")
    budgets.clear(model="old", reason="done")
    # Past its auto_clear_at: no longer refusing, so listed as cleared.
    expired = budgets.trip(provider="p", reason="e", auto_clear_at=timezone.now() + timedelta(1))
    KillSwitch.objects.filter(pk=expired.id).update(auto_clear_at=timezone.now())
    operator = client_for(keys["operator"])

    def reasons(**params: str) -> list[str]:
        response = operator.get(SWITCHES, params)
        assert response.status_code == 200, response.content
        return sorted(s["reason"] for s in response.json()["results"])

    assert reasons() == ["a", "e", "g", "o"]
    assert reasons(state="open") == ["a", "g"]
    assert reasons(state="cleared") == ["e", "o"]
    assert reasons(state="open", tenant="acme") == ["a"]
    response = operator.get(SWITCHES, {"state": "tripped"})
    assert response.status_code == 400
    assert error(response)["field"] == "state"


def test_a_switch_on_one_api_key_refuses_only_calls_through_that_key(
    keys: dict[str, str],
) -> None:
    seed(limit="1000")  # room for every call below
    other = new_key("acme", name="batch")
    response = trip(keys["operator"], api_key=prefix_of(keys["acme"]))
    assert response.status_code == 201, response.content
    switch = response.json()
    assert switch["api_key"] == prefix_of(keys["acme"])
    assert switch["scope"] == f"API key {prefix_of(keys['acme'])}"

    refused = reserve(keys["acme"])
    assert refused.status_code == 403
    assert error(refused)["scope"] == f"API key {prefix_of(keys['acme'])}"
    assert reserve(other).status_code == 201
    assert reserve(keys["operator"], tenant="acme").status_code == 201
    reserve_30()  # in process: no key, not covered
    listed = client_for(keys["operator"]).get(SWITCHES, {"state": "open"}).json()["results"]
    assert [s["api_key"] for s in listed] == [prefix_of(keys["acme"])]

    assert clear(keys["operator"], api_key=prefix_of(keys["acme"])).status_code == 200
    assert reserve(keys["acme"]).status_code == 201


def test_a_key_switch_intersects_with_the_other_fields(keys: dict[str, str]) -> None:
    budgets.trip(api_key=prefix_of(keys["acme"]), model="m-other", reason="r")
    assert reserve(keys["acme"]).status_code == 201  # another model through the key
    budgets.trip(api_key=prefix_of(keys["acme"]), model=FAKE_MODEL, reason="r2")
    assert reserve(keys["acme"]).status_code == 403
    reserve_30()  # the same model in process: not through the key


def test_a_deleted_key_takes_its_switches_with_it(keys: dict[str, str]) -> None:
    budgets.trip(api_key=prefix_of(keys["acme"]), reason="r")
    ApiKey.objects.filter(prefix=prefix_of(keys["acme"])).delete()
    assert not KillSwitch.objects.exists()


# allow_degrade (issue 5 item 4 over HTTP)


def test_allow_degrade_is_passed_to_admission_and_the_201_says_what_was_granted() -> None:
    _setup()
    key = new_key("acme")
    reserve_30(max_output_tokens=2667)  # 80.01 % used: the model rung applies
    assert reserve(key).status_code == 429  # 30 > 19.99 remaining, no degrading asked
    response = reserve(key, allow_degrade=True)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["model"], body["requested_model"], body["degraded"]) == (CHEAP, FAKE_MODEL, True)
    assert (body["max_output_tokens"], body["amount"]) == (1000, "10")
    assert client_for(key).get(f"{BASE}reservations/{body['id']}").json()["degraded"] is True


def test_the_ceiling_rung_over_http() -> None:
    _setup()
    key = new_key("acme")
    reserve_30(max_output_tokens=3170)  # 95.1 %
    body = reserve(key, allow_degrade=True).json()
    assert (body["model"], body["max_output_tokens"], body["degraded"]) == (CHEAP, 100, True)
    assert Decimal(body["amount"]) == Decimal(1)


def test_an_undegraded_hold_reports_no_requested_model(keys: dict[str, str]) -> None:
    body = reserve(keys["acme"], allow_degrade=True).json()
    assert (body["model"], body["requested_model"], body["degraded"]) == (FAKE_MODEL, "", False)


def test_allow_degrade_must_be_a_boolean(keys: dict[str, str]) -> None:
    response = reserve(keys["acme"], allow_degrade="maybe")
    assert response.status_code == 400
    assert error(response)["field"] == "allow_degrade"


def test_a_connection_cut_while_answering_a_trip_is_a_503(keys: dict[str, str]) -> None:
    """The answer names the end user, read after the switch is written: a connection cut there
    is a 503 like any other lost answer, never a 500 (the long fault soak saw one)."""
    assert trip(keys["operator"], tenant="acme", end_user="alice").status_code == 201

    def cut_on_reading_the_user_by_id(execute: Any, sql: str, *args: Any) -> Any:
        if 'FROM "llm_budgets_enduser"' in sql and 'WHERE "llm_budgets_enduser"."id" =' in sql:
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, *args)

    # Tripped again: the open switch is read back, its end user not with it.
    with connection.execute_wrapper(cut_on_reading_the_user_by_id):
        response = trip(keys["operator"], tenant="acme", end_user="alice")
    assert response.status_code == 503, response.content
    assert response.headers["Retry-After"]
