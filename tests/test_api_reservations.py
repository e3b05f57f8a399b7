"""REST API: every reservation endpoint and every error code it can answer."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetError, LedgerUnavailable
from llm_budgets.models import Counter, Reservation, ReservationState, UsageRecord
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> Any:
    seed(limit="100")
    return client_for(new_key("acme"))


def reserve(client: Any, **overrides: Any) -> Any:
    return client.post(f"{BASE}reservations", reserve_body(**overrides), format="json")


def error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]), body
    return body["error"]


def test_reserve_answers_201_with_the_hold(acme: Any) -> None:
    response = reserve(acme, end_user="u-1", ttl_seconds=60)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "held"
    assert body["amount"] == "30"
    assert body["currency"] == "USD"
    assert body["model"] == "m30"
    assert body["max_output_tokens"] == 1000
    assert body["degraded"] is False
    assert body["tenant"] == "acme"
    assert body["end_user"] == "u-1"
    reservation = Reservation.objects.get(pk=body["id"])
    assert reservation.expires_at - reservation.created_at == timedelta(seconds=60)
    assert Counter.objects.get().reserved == Decimal(30)


def test_an_operator_key_names_the_tenant() -> None:
    seed()
    operator = client_for(new_key(None))
    response = reserve(operator)
    assert response.status_code == 400
    assert error(response)["field"] == "tenant"
    assert reserve(operator, tenant="acme").status_code == 201


def test_get_commit_and_repeat_commit(acme: Any) -> None:
    hold_id = reserve(acme).json()["id"]
    got = acme.get(f"{BASE}reservations/{hold_id}")
    assert got.status_code == 200
    assert got.json()["id"] == hold_id
    usage = {"input_tokens": 0, "output_tokens": 500}
    first = acme.post(f"{BASE}reservations/{hold_id}/commit", usage, format="json")
    assert first.status_code == 200, first.content
    assert first.json() == {
        "id": hold_id,
        "state": "committed",
        "cost": "15",
        "reserved": "30",
        "overage": "0",
        "currency": "USD",
        "customer_cost": "15",
        "pricing_basis": "price",
    }
    again = acme.post(f"{BASE}reservations/{hold_id}/commit", usage, format="json")
    assert again.status_code == 200
    assert again.json() == first.json()
    assert UsageRecord.objects.count() == 1
    counter = Counter.objects.get()
    assert (counter.spent, counter.reserved) == (Decimal(15), Decimal(0))


def test_release_then_commit_is_a_409(acme: Any) -> None:
    hold_id = reserve(acme).json()["id"]
    released = acme.post(f"{BASE}reservations/{hold_id}/release")
    assert released.status_code == 200
    assert released.json()["state"] == "released"
    assert Counter.objects.get().reserved == 0
    commit = acme.post(
        f"{BASE}reservations/{hold_id}/commit",
        {"input_tokens": 1, "output_tokens": 1},
        format="json",
    )
    assert commit.status_code == 409
    assert error(commit)["code"] == "reservation_state"
    assert error(commit)["state"] == "released"


def test_extend_pushes_the_expiry_later_and_never_earlier(acme: Any) -> None:
    hold_id = reserve(acme, ttl_seconds=60).json()["id"]
    before = Reservation.objects.get(pk=hold_id).expires_at
    longer = acme.post(f"{BASE}reservations/{hold_id}/extend", {"ttl_seconds": 600}, "json")
    assert longer.status_code == 200, longer.content
    after = Reservation.objects.get(pk=hold_id).expires_at
    assert after - before >= timedelta(seconds=530)
    shorter = acme.post(f"{BASE}reservations/{hold_id}/extend", {"ttl_seconds": 5}, "json")
    assert shorter.status_code == 200
    assert Reservation.objects.get(pk=hold_id).expires_at == after


def test_extend_only_a_held_reservation(acme: Any) -> None:
    hold_id = reserve(acme).json()["id"]
    acme.post(f"{BASE}reservations/{hold_id}/release")
    response = acme.post(f"{BASE}reservations/{hold_id}/extend", {"ttl_seconds": 60}, "json")
    assert response.status_code == 409
    assert error(response)["code"] == "reservation_state"


def test_extend_past_the_maximum_ttl_is_a_400(acme: Any) -> None:
    hold_id = reserve(acme).json()["id"]
    response = acme.post(
        f"{BASE}reservations/{hold_id}/extend", {"ttl_seconds": 10**9}, format="json"
    )
    assert response.status_code == 400
    assert error(response)["field"] == "ttl_seconds"


def test_an_extended_hold_outlives_its_first_expiry(acme: Any) -> None:
    hold_id = reserve(acme, ttl_seconds=60).json()["id"]
    acme.post(f"{BASE}reservations/{hold_id}/extend", {"ttl_seconds": 3600}, "json")
    with time_machine.travel(timezone.now() + timedelta(minutes=30)):
        assert budgets.sweep() == 0
    assert Reservation.objects.get(pk=hold_id).state == ReservationState.HELD


def test_uncertain_keeps_the_hold_counted(acme: Any) -> None:
    hold_id = reserve(acme).json()["id"]
    response = acme.post(f"{BASE}reservations/{hold_id}/uncertain")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == ReservationState.UNCERTAIN
    assert Reservation.objects.get(pk=hold_id).state == ReservationState.UNCERTAIN
    assert Counter.objects.get().reserved == Decimal(30)


def test_budget_refusal_is_a_429_that_explains_itself(acme: Any) -> None:
    for _ in range(3):
        assert reserve(acme).status_code == 201
    response = reserve(acme)
    assert response.status_code == 429
    body = error(response)
    assert body["code"] == "budget_exceeded"
    assert body["budget"]["scope"] == "tenant acme"
    assert body["budget"]["window"] == "month"
    assert body["budget"]["limit"] == "100"
    assert body["budget"]["remaining"] == "10"
    assert body["requested"] == "30"
    resets_at = body["budget"]["resets_at"]
    assert resets_at is not None
    assert 0 < int(response["Retry-After"]) <= 31 * 24 * 3600
    assert Reservation.objects.count() == 3


def test_validation_names_each_bad_field(acme: Any) -> None:
    response = acme.post(
        f"{BASE}reservations",
        {"model": "", "input_tokens": -1, "max_output_tokens": "many", "colour": "red"},
        format="json",
    )
    assert response.status_code == 400
    assert set(error(response)["fields"]) == {"colour"}  # unknown fields first
    response = acme.post(
        f"{BASE}reservations",
        {"model": "", "input_tokens": -1, "max_output_tokens": "many"},
        format="json",
    )
    assert response.status_code == 400
    body = error(response)
    assert body["code"] == "invalid"
    assert set(body["fields"]) == {"model", "input_tokens", "max_output_tokens"}
    assert Reservation.objects.count() == 0


def test_service_validation_is_a_400_naming_the_field(acme: Any) -> None:
    response = reserve(acme, input_tokens=10**12)
    assert response.status_code == 400
    body = error(response)
    assert body["field"] == "input_tokens"
    assert body["fields"] == {"input_tokens": [body["message"]]}


def test_malformed_json_is_a_400(acme: Any) -> None:
    response = acme.post(f"{BASE}reservations", "{nope", content_type="application/json")
    assert response.status_code == 400
    assert error(response)["code"] == "parse_error"


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"model": "no-such-model"}, "unknown_price"),
        ({"max_output_tokens": None}, "output_ceiling_required"),
    ],
)
def test_unpriceable_requests_are_422(acme: Any, overrides: dict[str, Any], code: str) -> None:
    response = reserve(acme, **overrides)
    assert response.status_code == 422
    assert error(response)["code"] == code


def test_no_budget_is_a_422() -> None:
    seed()
    budgets.ensure_tenant(tenant="nocap")
    response = reserve(client_for(new_key("nocap")))
    assert response.status_code == 422
    assert error(response)["code"] == "no_budget"


def test_ledger_unavailable_is_a_503_with_retry_after(acme: Any) -> None:
    with mock.patch(
        "llm_budgets.engine.admission.reservation_admit",
        side_effect=LedgerUnavailable("The budget ledger could not be read.", retry_after=3),
    ):
        response = reserve(acme)
    assert response.status_code == 503
    assert error(response)["code"] == "ledger_unavailable"
    assert response["Retry-After"] == "3"


def test_a_kill_switch_error_maps_to_403_by_its_code(acme: Any) -> None:
    # The seam for [control]: any BudgetError whose code is kill_switch_active is a 403
    # carrying its context (the reason), without touching the API layer.
    class KillSwitchActive(BudgetError):
        code = "kill_switch_active"

    refusal = KillSwitchActive("Model m30 is switched off.", reason="runaway spend")
    with mock.patch("llm_budgets.engine.admission.reservation_admit", side_effect=refusal):
        response = reserve(acme)
    assert response.status_code == 403
    assert error(response) == {
        "code": "kill_switch_active",
        "message": "Model m30 is switched off.",
        "reason": "runaway spend",
    }


def test_unknown_reservations_are_404(acme: Any) -> None:
    for bad in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        response = acme.get(f"{BASE}reservations/{bad}")
        assert response.status_code == 404
        assert error(response)["code"] == "reservation_not_found"
        commit = acme.post(
            f"{BASE}reservations/{bad}/commit",
            {"input_tokens": 0, "output_tokens": 0},
            format="json",
        )
        assert commit.status_code == 404


def test_unknown_paths_are_a_json_404(acme: Any) -> None:
    response = acme.get(f"{BASE}nothing/here")
    assert response.status_code == 404
    assert error(response)["code"] == "not_found"


def test_unstorable_text_is_a_400_not_a_ledger_outage(acme: Any) -> None:
    # PostgreSQL text cannot hold NUL: without the check this surfaced as a 503.
    response = reserve(acme, end_user="u\x00")
    assert response.status_code == 400
    assert error(response)["field"] == "end_user"
    keyed = acme.post(f"{BASE}reservations", reserve_body(idempotency_key="k\x00"), format="json")
    assert keyed.status_code == 400
    for path, params in [
        ("prices", {"provider": "a\x00"}),
        ("tenants/acme/status", {"end_user": "a\x00"}),
    ]:
        assert acme.get(f"{BASE}{path}", params).status_code == 400, path


def test_a_huge_offset_is_an_empty_page(acme: Any) -> None:
    response = acme.get(f"{BASE}prices", {"offset": 10**30})
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_the_provider_may_be_left_out_when_one_provider_prices_the_model(acme: Any) -> None:
    body = reserve_body()
    del body["provider"]
    response = acme.post(f"{BASE}reservations", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["provider"] == "fake"


def test_wrong_method_and_media_type_answer_in_the_error_shape(acme: Any) -> None:
    wrong_method = acme.get(f"{BASE}reservations")
    assert wrong_method.status_code == 405
    assert error(wrong_method)["code"] == "method_not_allowed"
    form = acme.post(f"{BASE}reservations", {"model": "m30"})  # multipart, not JSON
    assert form.status_code == 415
    assert error(form)["code"] == "unsupported_media_type"
