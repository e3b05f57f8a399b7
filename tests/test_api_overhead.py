"""The REST API's per-request work, trimmed (issue 15): authentication reads the key, the source's
failed attempts and (PostgreSQL) counts the key's throttle hit in one statement; the commit view's
tenant check rides along; request serializers copy their fields cheaply and responses render from
one serializer per class. Each trim keeps the behaviour it replaced: these tests pin that."""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers as drf

from llm_budgets import budgets
from llm_budgets.api import scoping
from llm_budgets.api import serializers as s
from llm_budgets.models import ApiKey, RateCounter, Reservation
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

pytestmark = pytest.mark.django_db


def status(key: str, remote: str = "10.0.0.1") -> int:
    return client_for(key).get(f"{BASE}tenants/acme/status", REMOTE_ADDR=remote).status_code


def key_hits(key: str) -> int:
    prefix = key.split(".")[0]
    return sum(RateCounter.objects.filter(key=f"api-key:{prefix}").values_list("hits", flat=True))


def auth_statements(queries: CaptureQueriesContext) -> list[str]:
    tables = (ApiKey._meta.db_table, RateCounter._meta.db_table)
    return [q["sql"] for q in queries.captured_queries if any(t in q["sql"] for t in tables)]


@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "100/minute"})
def test_authentication_and_the_throttle_take_one_statement_on_postgresql() -> None:
    seed()
    key = new_key("acme")
    assert status(key) == 200  # the window's first hit also deletes old windows
    assert key_hits(key) == 1
    with CaptureQueriesContext(connection) as queries:
        assert status(key) == 200
    # SQLite cannot modify data in a WITH: the throttle's upsert stays a statement of its own.
    assert len(auth_statements(queries)) == (1 if connection.vendor == "postgresql" else 2)
    assert key_hits(key) == 2


@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "2/minute", "API_AUTH_FAILURE_RATE": None})
def test_a_wrong_secret_does_not_use_up_the_keys_quota() -> None:
    seed()
    key = new_key("acme")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert [status(wrong) for _ in range(4)] == [401] * 4
    assert key_hits(key) == 0
    assert [status(key) for _ in range(3)] == [200, 200, 429]


@override_settings(
    LLM_BUDGETS={"API_THROTTLE_RATE": "100/minute", "API_AUTH_FAILURE_RATE": "2/minute"}
)
def test_a_blocked_source_is_refused_before_the_key_and_its_hit_is_not_counted() -> None:
    seed()
    key = new_key("acme")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert [status(wrong) for _ in range(2)] == [401, 401]
    generator = ApiKey.objects.key_generator
    with mock.patch.object(generator, "verify", wraps=generator.verify) as verify:
        assert status(key) == 429
    assert verify.call_count == 0  # the secret was not checked
    assert key_hits(key) == 0
    assert status(key, remote="10.0.0.2") == 200
    assert key_hits(key) == 1


@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "100/minute"})
def test_the_throttle_hit_is_committed_asynchronously_only_in_autocommit() -> None:
    seed()
    key = new_key("acme")
    # Inside a transaction (as here, and with a host's ATOMIC_REQUESTS) the setting would cover
    # the host's own writes: it is not used.
    with CaptureQueriesContext(connection) as queries:
        assert status(key) == 200
    assert not any("synchronous_commit" in q for q in auth_statements(queries))


@pytest.mark.django_db(transaction=True)
@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "100/minute"})
def test_in_autocommit_the_throttle_hit_does_not_wait_for_the_wal_flush() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL counts the hit in authentication's statement")
    seed()
    key = new_key("acme")
    assert status(key) == 200
    with CaptureQueriesContext(connection) as queries:
        assert status(key) == 200
    assert ["synchronous_commit" in q for q in auth_statements(queries)] == [True]
    assert key_hits(key) == 2
    with connection.cursor() as cursor:  # local to the statement's transaction: not the session
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_commit_takes_its_tenant_check_from_authentication() -> None:
    seed()
    client = client_for(new_key("acme"))
    rid = client.post(f"{BASE}reservations", reserve_body(), format="json").json()["id"]
    with mock.patch.object(scoping, "_reservation_id_sql", side_effect=AssertionError("read")):
        committed = client.post(
            f"{BASE}reservations/{rid}/commit", {"input_tokens": 0, "output_tokens": 1}, "json"
        )
    assert committed.status_code == 200, committed.content
    assert Reservation.objects.get(pk=rid).state == "committed"


@pytest.mark.parametrize("bad", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_commit_of_a_missing_reservation_is_still_a_404(bad: str) -> None:
    seed()
    client = client_for(new_key("acme"))
    response = client.post(
        f"{BASE}reservations/{bad}/commit", {"input_tokens": 0, "output_tokens": 1}, "json"
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "reservation_not_found"


def test_an_operator_key_commits_any_tenants_reservation() -> None:
    seed()
    rid = client_for(new_key("acme")).post(f"{BASE}reservations", reserve_body(), format="json")
    operator = client_for(new_key(None))
    committed = operator.post(
        f"{BASE}reservations/{rid.json()['id']}/commit",
        {"input_tokens": 0, "output_tokens": 1},
        "json",
    )
    assert committed.status_code == 200, committed.content


class DeepCopied(s.ReserveRequestSerializer):
    """DRF's own field copying, to compare with."""

    def get_fields(self) -> dict[str, drf.Field]:
        return drf.Serializer.get_fields(self)


BODIES: list[Any] = [
    reserve_body(),
    reserve_body(tenant="acme", end_user="u1", tags={"a": "b"}, max_tool_calls={"web": 2}),
    reserve_body(model=" m30"),
    reserve_body(model=12, input_tokens="x", tags={"a": 1}, max_tool_calls={"web": -1}),
    reserve_body(messages=[], prompt=3, ttl_seconds=0, nonsense=1),
    reserve_body(end_user=None, provider=None, max_output_tokens=None),
    {},
    [],
]


@pytest.mark.parametrize("body", BODIES)
def test_request_serializers_validate_as_with_drfs_deepcopy(body: Any) -> None:
    ours, theirs = s.ReserveRequestSerializer(data=body), DeepCopied(data=body)
    assert ours.is_valid() == theirs.is_valid()
    assert ours.errors == theirs.errors
    if not ours.errors:
        assert dict(ours.validated_data) == dict(theirs.validated_data)


def test_request_serializer_instances_share_no_field_state() -> None:
    first, second = s.ReserveRequestSerializer(), s.ReserveRequestSerializer()
    for name, field in first.fields.items():
        other = second.fields[name]
        assert field is not other
        assert field.parent is first
        assert other.parent is second
        assert field.validators is not other.validators
        assert field.validators == other.validators
        child = getattr(field, "child", None)
        if child is not None:
            assert child is not other.child
            assert child.parent is field
    first.fields["model"].validators.append(lambda value: None)
    assert len(s.ReserveRequestSerializer().fields["model"].validators) == len(
        second.fields["model"].validators
    )


def test_responses_render_as_the_serializer_does() -> None:
    seed()
    budgets.ensure_tenant(tenant="acme")
    client = client_for(new_key("acme"))
    body = reserve_body(end_user="u1", tags={"feature": "chat"})
    created = client.post(f"{BASE}reservations", body, format="json")
    reservation = Reservation.objects.select_related("tenant", "end_user").get(
        pk=created.json()["id"]
    )
    expected = dict(s.ReservationSerializer(reservation).data)
    assert s.represent(s.ReservationSerializer, reservation) == expected
    assert created.json() == client.get(f"{BASE}reservations/{reservation.pk}").json()


def test_validating_with_the_threads_fields_keeps_each_result_to_its_serializer() -> None:
    bad = s.validating(s.ReserveRequestSerializer, reserve_body(model=12, input_tokens=-1))
    good = s.validating(s.ReserveRequestSerializer, reserve_body(tags={"a": "b"}))
    assert not bad.is_valid()
    assert good.is_valid(), good.errors
    assert set(bad.errors) == {"model", "input_tokens"}
    assert good.validated_data["tags"] == {"a": "b"}
    for body in BODIES:  # the same answers as DRF's own per-instance copies
        ours, theirs = s.validating(s.ReserveRequestSerializer, body), DeepCopied(data=body)
        assert ours.is_valid() == theirs.is_valid()
        assert ours.errors == theirs.errors


def test_each_thread_validates_with_fields_of_its_own() -> None:
    here = s.validating(s.CommitRequestSerializer, {}).fields
    there: list[Any] = []
    thread = threading.Thread(
        target=lambda: there.append(s.validating(s.CommitRequestSerializer, {}).fields)
    )
    thread.start()
    thread.join()
    assert s.validating(s.CommitRequestSerializer, {}).fields is here
    assert there[0] is not here
    assert not set(map(id, here.values())) & set(map(id, there[0].values()))


@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "100/minute"})
def test_a_view_without_the_key_throttle_counts_nothing() -> None:
    from rest_framework.response import Response
    from rest_framework.test import APIRequestFactory

    from llm_budgets.api.views import ApiView

    class Unthrottled(ApiView):
        throttle_classes: list[Any] = []

        def get(self, request: Any) -> Response:
            return Response({})

    seed()
    key = new_key("acme")
    request = APIRequestFactory().get("/x", HTTP_AUTHORIZATION=f"Api-Key {key}")
    assert Unthrottled.as_view()(request).status_code == 200
    assert key_hits(key) == 0
    assert status(key) == 200
    assert key_hits(key) == 1


@override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": "2/minute"})
def test_a_hosts_own_hasher_is_never_asked_for_an_unsalted_hash_and_the_throttle_still_counts() -> (
    None
):
    """Only the default unsalted SHA-512 can be recomputed in SQL; any other hasher (a host's
    salted one) is left to verify the key, and the hit is counted in a statement of its own."""
    seed()
    key = new_key("acme")
    generator = ApiKey.objects.key_generator
    default = generator.preferred_hasher
    own = mock.Mock(wraps=default, algorithm=default.algorithm)  # not a Sha512ApiKeyHasher
    with mock.patch.object(generator, "preferred_hasher", own):
        assert [status(key) for _ in range(3)] == [200, 200, 429]
    own.encode.assert_not_called()
    assert key_hits(key) == 3


def _subclasses(cls: type) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def test_request_fields_have_no_mutable_default_to_share() -> None:
    """``_fresh`` copies a declared field shallowly (DRF deep-copies it): a mutable default or
    initial (a list, a dict) would be one object shared by every request and thread."""
    from decimal import Decimal

    immutable = (type(None), bool, int, float, str, Decimal, tuple, frozenset)
    shared = []
    for serializer in _subclasses(s.StrictSerializer):
        for name, field in serializer._declared_fields.items():
            for attribute in ("default", "initial"):
                value = getattr(field, attribute, drf.empty)
                if value is drf.empty or callable(value) or isinstance(value, immutable):
                    continue
                if value is getattr(type(field), attribute, None):
                    continue  # DRF's own class-level value (ListField.initial): shared in DRF too
                shared.append(f"{serializer.__name__}.{name}.{attribute} = {value!r}")
    assert _subclasses(s.StrictSerializer), "no request serializer found"
    assert shared == []
