"""Tags on reservations: bounded string pairs, kept on the reservation and copied onto every
ledger line it produces (charge, estimated expiry), in-process and over the REST API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets.engine import settlement
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import Counter, Reservation, UsageRecord
from llm_budgets.tags import MAX_KEY_LENGTH, MAX_TAGS, MAX_VALUE_LENGTH
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db

TAGS = {"feature": "chat", "trace": "a1b2 c3", "empty": ""}


def test_tags_are_copied_onto_the_charge_and_the_estimated_expiry() -> None:
    seed()
    hold = reserve_30(tags=TAGS)
    assert Reservation.objects.get(pk=hold.id).tags == TAGS
    hold.commit(input_tokens=0, output_tokens=100)
    expiring = reserve_30(tags={"feature": "batch"}, ttl=1)
    settlement.reservations_sweep(now=timezone.now() + timedelta(seconds=5))
    lines = {line.reservation_id: line for line in UsageRecord.objects.all()}
    assert lines[hold.id].tags == TAGS
    assert (lines[expiring.id].tags, lines[expiring.id].is_estimated) == (
        {"feature": "batch"},
        True,
    )


def test_no_tags_is_an_empty_mapping() -> None:
    seed()
    hold = reserve_30()
    hold.commit(input_tokens=0, output_tokens=1)
    assert Reservation.objects.get().tags == {} == UsageRecord.objects.get().tags


@pytest.mark.parametrize(
    "tags",
    [
        ["feature"],
        "feature=chat",
        {f"k{i}": "v" for i in range(MAX_TAGS + 1)},
        {"k" * (MAX_KEY_LENGTH + 1): "v"},
        {"": "v"},
        {"feature": "v" * (MAX_VALUE_LENGTH + 1)},
        {"feature": 3},
        {"feature": None},
        {"feature": "nul\x00"},
    ],
)
def test_bad_tags_are_refused_naming_the_field_and_hold_nothing(tags: Any) -> None:
    seed()
    with pytest.raises(InvalidUsage) as caught:
        reserve_30(tags=tags)
    assert caught.value.field == "tags"  # type: ignore[attr-defined]
    assert not Reservation.objects.exists()
    assert not Counter.objects.filter(reserved__gt=0).exists()


def test_the_limits_themselves_are_allowed() -> None:
    seed()
    most = {f"{i:0{MAX_KEY_LENGTH}d}": "v" * MAX_VALUE_LENGTH for i in range(MAX_TAGS)}
    assert Reservation.objects.get(pk=reserve_30(tags=most).id).tags == most


def test_tags_over_the_api() -> None:
    seed()
    acme = client_for(new_key("acme"))
    response = acme.post(f"{BASE}reservations", reserve_body(tags=TAGS), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["tags"] == TAGS
    assert acme.get(f"{BASE}reservations/{body['id']}").json()["tags"] == TAGS
    acme.post(
        f"{BASE}reservations/{body['id']}/commit", {"input_tokens": 0, "output_tokens": 1}, "json"
    )
    assert UsageRecord.objects.get().tags == TAGS
    untagged = acme.post(f"{BASE}reservations", reserve_body(), format="json")
    assert untagged.json()["tags"] == {}


@pytest.mark.parametrize(
    ("tags", "field"),
    [
        ({"feature": 3}, "tags.feature"),  # shape: the serializer
        ({"feature": ["chat"]}, "tags.feature"),
        ({f"k{i}": "v" for i in range(MAX_TAGS + 1)}, "tags"),  # meaning: the service
        ({"feature": "v" * (MAX_VALUE_LENGTH + 1)}, "tags"),
    ],
)
def test_bad_tags_over_the_api_are_a_400(tags: Any, field: str) -> None:
    seed()
    acme = client_for(new_key("acme"))
    response = acme.post(f"{BASE}reservations", reserve_body(tags=tags), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert not Reservation.objects.exists()
