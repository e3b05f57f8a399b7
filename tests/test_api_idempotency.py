"""REST API: Idempotency-Key on every POST, race-safe."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.client import error_from_response
from llm_budgets.engine import admission
from llm_budgets.exceptions import IdempotencyKeyReused
from llm_budgets.models import ApiKey, Counter, IdempotencyRecord, Reservation
from tests.api import BASE, client_for, new_key, reserve_body
from tests.concurrency import run_threads
from tests.factories import seed


def post(client: Any, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(f"{BASE}{path}", body, format="json", **headers)


@pytest.mark.django_db
def test_a_replay_returns_the_first_response_and_changes_nothing() -> None:
    seed()
    client = client_for(new_key("acme"))
    first = post(client, "reservations", reserve_body(), key="k-1")
    again = post(client, "reservations", reserve_body(), key="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert not first.has_header("Idempotent-Replayed")
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == Decimal(30)


@pytest.mark.django_db
def test_the_key_may_come_in_the_body() -> None:
    seed()
    client = client_for(new_key("acme"))
    first = post(client, "reservations", reserve_body(idempotency_key="k-2"))
    again = post(client, "reservations", reserve_body(idempotency_key="k-2"))
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    mismatch = post(client, "reservations", reserve_body(idempotency_key="a"), key="b")
    assert mismatch.status_code == 400


@pytest.mark.django_db
def test_the_same_key_with_another_body_or_path_is_a_409() -> None:
    seed()
    client = client_for(new_key("acme"))
    hold_id = post(client, "reservations", reserve_body(), key="k-3").json()["id"]
    other_body = post(client, "reservations", reserve_body(input_tokens=5), key="k-3")
    assert other_body.status_code == 409
    assert other_body.json()["error"]["code"] == "idempotency_key_reused"
    other_path = post(client, f"reservations/{hold_id}/release", {}, key="k-3")
    assert other_path.status_code == 409
    assert Reservation.objects.get().state == "held"


@pytest.mark.django_db
def test_keys_are_per_api_key() -> None:
    seed()
    one, two = client_for(new_key("acme")), client_for(new_key("acme"))
    first = post(one, "reservations", reserve_body(), key="same")
    # The stored responses are per API key, but the reservation's own key is per tenant
    # (docs/api.md): through another API key, a different request with that key is refused by
    # admission itself, naming what differs; the same request gets the tenant's reservation.
    other = post(two, "reservations", reserve_body(input_tokens=7), key="same")
    assert other.status_code == 409, other.json()
    error = other.json()["error"]
    assert (error["code"], error["differs"]) == ("idempotency_key_reused", "input_tokens")
    assert error["reservation_id"] == first.json()["id"]
    assert "Idempotent-Replayed" not in other
    # The HTTP client rebuilds the in-process exception from that body.
    rebuilt = error_from_response(
        httpx.Response(409, json=other.json(), request=httpx.Request("POST", "http://api.test"))
    )
    assert isinstance(rebuilt, IdempotencyKeyReused)
    assert (rebuilt.differs, rebuilt.reservation_id) == ("input_tokens", first.json()["id"])
    same = post(two, "reservations", reserve_body(), key="same")
    assert first.status_code == same.status_code == 201
    assert "Idempotent-Replayed" not in same
    assert same.json()["id"] == first.json()["id"]
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == Decimal(30)
    assert IdempotencyRecord.objects.filter(key="same").count() == 2
    # Each API key replays its own stored response.
    replay = post(two, "reservations", reserve_body(), key="same")
    assert replay["Idempotent-Replayed"] == "true"
    assert post(two, "reservations", reserve_body(input_tokens=7), key="same").status_code == 409


@pytest.mark.django_db
def test_a_failed_request_is_not_stored_so_its_retry_runs_again() -> None:
    seed(limit="20")
    client = client_for(new_key("acme"))
    refused = post(client, "reservations", reserve_body(), key="k-4")
    assert refused.status_code == 429
    assert not IdempotencyRecord.objects.exists()
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month")
    retried = post(client, "reservations", reserve_body(), key="k-4")
    assert retried.status_code == 201


@pytest.mark.django_db
def test_every_post_endpoint_is_idempotent() -> None:
    seed()
    operator = client_for(new_key(None))
    hold_id = post(operator, "reservations", reserve_body(tenant="acme")).json()["id"]
    for path, body in [
        (f"reservations/{hold_id}/extend", {"ttl_seconds": 300}),
        (f"reservations/{hold_id}/commit", {"input_tokens": 0, "output_tokens": 10}),
        (f"reservations/{hold_id}/release", {}),
        ("budgets", {"tenant": "acme", "window": "day", "amount": "9"}),
    ]:
        first = post(operator, path, body, key=f"k-{path}")
        again = post(operator, path, body, key=f"k-{path}")
        assert first.status_code == again.status_code, (path, first.content)
        assert again.json() == first.json()
        assert again.has_header("Idempotent-Replayed") == (first.status_code < 300), path


@pytest.mark.django_db
def test_a_request_still_running_is_a_409_and_a_dead_one_is_reclaimed() -> None:
    seed()
    key = new_key("acme")
    client = client_for(key)
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    record = IdempotencyRecord.objects.create(
        api_key=api_key,
        key="k-5",
        method="POST",
        path=f"{BASE}reservations",
        request_hash="x",
        created_at=timezone.now(),
    )
    running = post(client, "reservations", reserve_body(), key="k-5")
    assert running.status_code == 409
    assert running.json()["error"]["code"] in ("idempotency_in_progress", "idempotency_key_reused")
    record.request_hash = ""
    record.created_at = timezone.now() - timedelta(minutes=5)
    record.save()
    reclaimed = post(client, "reservations", reserve_body(), key="k-5")
    assert reclaimed.status_code == 201
    assert IdempotencyRecord.objects.get().status_code == 201


@pytest.mark.django_db
def test_a_request_in_progress_with_the_same_body_is_a_409_in_progress() -> None:
    seed()
    key = new_key("acme")
    client = client_for(key)
    first = post(client, "reservations", reserve_body(), key="k-6")
    record = IdempotencyRecord.objects.get()
    record.status_code = None
    record.save()
    running = post(client, "reservations", reserve_body(), key="k-6")
    assert running.status_code == 409
    assert running.json()["error"]["code"] == "idempotency_in_progress"
    assert running["Retry-After"] == "1"
    assert first.status_code == 201


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_concurrent_duplicates_run_once() -> None:
    seed()
    key = new_key("acme")
    calls: list[int] = []
    real = admission.reservation_admit

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)  # the service also dedupes by key: count that the view ran it once
        return real(*args, **kwargs)

    def work(_: int) -> tuple[int, str]:
        response = post(client_for(key), "reservations", reserve_body(), key="race")
        code = response.json().get("id") or response.json()["error"]["code"]
        return response.status_code, code

    with mock.patch("llm_budgets.engine.admission.reservation_admit", side_effect=counted):
        results = run_threads(8, work)
    assert all(isinstance(r, tuple) for r in results), results
    assert len(calls) == 1, results
    assert len({code for status, code in results if status == 201}) == 1, results
    assert all(
        status == 201 or (status, code) == (409, "idempotency_in_progress")
        for status, code in results
    ), results
    assert Reservation.objects.count() == 1
    assert Counter.objects.get().reserved == Decimal(30)
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.django_db
def test_old_records_are_cleared_and_their_key_runs_again() -> None:
    seed()
    client = client_for(new_key("acme"))
    first = post(client, "budgets", {}, key="old")  # a 403 for a tenant key: not stored
    assert first.status_code == 403
    post(client, "reservations", reserve_body(), key="recent")
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=30))
    post(client, "reservations", reserve_body(input_tokens=1), key="fresh")
    call_command("llm_budgets_clear_idempotency_keys", "--hours", "24")
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh"]
    again = post(client, "reservations", reserve_body(), key="recent")
    assert again.status_code == 201
    assert not again.has_header("Idempotent-Replayed")
    # The reservation's own key still returns the same reservation.
    assert Reservation.objects.count() == 2
