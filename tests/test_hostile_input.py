"""Hostile input to the REST API and the services (issue #17 items 6 and 8): every bug found by
the probe has a regression test here, and every refusal is the API's JSON error shape.

Identifiers: NFKC, invisible characters refused, case kept (docs/reliability.md, "Identifiers").
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import override_settings

from llm_budgets import budgets, validation
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import Budget, EndUser, IdempotencyRecord, Reservation, Tenant
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> Any:
    seed(limit="1000")
    return client_for(new_key("acme"))


@pytest.fixture
def operator() -> Any:
    seed(limit="1000")
    return client_for(new_key(None))


def error(response: Any) -> dict[str, Any]:
    assert response["Content-Type"] == "application/json", response.content[:200]
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]), body
    return body["error"]


def reserve(client: Any, **overrides: Any) -> Any:
    return client.post(f"{BASE}reservations", reserve_body(**overrides), format="json")


def raw_post(client: Any, path: str, data: bytes, **extra: Any) -> Any:
    return client.generic("POST", f"{BASE}{path}", data, content_type="application/json", **extra)


# --- Identifiers: one canonical form, invisible characters refused -------------------------

LOOKALIKES_OF_U1 = {
    "fullwidth": "\uff551",  # compatibility form: NFKC makes it u1
}
INVISIBLE = {
    "zero-width space": "u1\u200b",
    "soft hyphen": "u\u00ad1",
    "BOM": "\ufeffu1",
    "right-to-left mark": "u1\u200f",
    "left-to-right embedding": "\u202au1",
    "word joiner": "u\u20601",
    "hangul filler": "u1\u3164",
    "variation selector": "u1\ufe0f",
    "replacement character (undecodable input)": "u1\ufffd",
    "tab": "u\t1",
    "private use": "u1\ue000",
}


@pytest.mark.parametrize("text", list(INVISIBLE.values()), ids=list(INVISIBLE))
def test_an_identifier_with_an_invisible_character_is_refused_naming_it(text: str) -> None:
    with pytest.raises(InvalidUsage) as caught:
        validation.identifier("end_user", text)
    assert caught.value.context["field"] == "end_user"
    assert "U+" in caught.value.message
    assert "position" in caught.value.message


def test_identifiers_are_nfkc_and_keep_their_case() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert validation.identifier("end_user", nfd) == nfc
    assert validation.identifier("end_user", nfc) == nfc
    assert validation.identifier("end_user", "\uff551") == "u1"
    # Case is significant (two systems' ids may differ only by case): kept as given.
    assert validation.identifier("end_user", "U1") == "U1"
    with pytest.raises(InvalidUsage, match="white space"):
        validation.identifier("tenant", " acme")


def test_lookalike_end_users_are_one_end_user_and_invisible_ones_are_refused(acme: Any) -> None:
    assert reserve(acme, end_user="u1").status_code == 201
    assert reserve(acme, end_user="\uff551").status_code == 201
    assert reserve(acme, end_user="cafe\u0301").status_code == 201
    assert reserve(acme, end_user="caf\u00e9").status_code == 201
    for text in INVISIBLE.values():
        response = reserve(acme, end_user=text)
        assert response.status_code == 400, (text, response.content)
        assert error(response)["field"] == "end_user"
    assert sorted(EndUser.objects.values_list("external_id", flat=True)) == ["caf\u00e9", "u1"]
    # U1 is another id, deliberately (docs/reliability.md).
    assert reserve(acme, end_user="U1").status_code == 201
    assert EndUser.objects.count() == 3


def test_the_python_api_normalises_the_same_way() -> None:
    seed()
    budgets.ensure_tenant(tenant="\uff41\uff43\uff4d\uff45")  # fullwidth "acme": the same tenant
    assert Tenant.objects.count() == 1
    with pytest.raises(InvalidUsage, match="U\\+200B"):
        budgets.ensure_tenant(tenant="acme\u200b")
    assert Tenant.objects.count() == 1


def test_tag_names_are_normalised_and_a_collision_is_refused(acme: Any) -> None:
    response = reserve(acme, tags={"\uff46eature": "chat"})
    assert response.status_code == 201, response.content
    assert response.json()["tags"] == {"feature": "chat"}
    response = reserve(acme, tags={"feature": "a", "\uff46eature": "b"})
    assert response.status_code == 400
    assert "same tag name" in error(response)["message"]
    response = reserve(acme, tags={"feat\u200bure": "x"})
    assert response.status_code == 400


def test_idempotency_keys_are_normalised(acme: Any) -> None:
    first = acme.post(f"{BASE}reservations", reserve_body(idempotency_key="k\u00e9"), format="json")
    assert first.status_code == 201
    again = acme.post(
        f"{BASE}reservations", reserve_body(idempotency_key="ke\u0301"), format="json"
    )
    assert again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert Reservation.objects.count() == 1
    refused = acme.post(
        f"{BASE}reservations", reserve_body(idempotency_key="k\u200b"), format="json"
    )
    assert refused.status_code == 400
    assert error(refused)["code"] == "invalid"


def test_the_tenant_in_the_path_is_normalised(acme: Any) -> None:
    assert acme.get(f"{BASE}tenants/\uff41cme/status").status_code == 200
    assert acme.get(f"{BASE}tenants/acme%E2%80%8B/status").status_code == 400


# --- Headers: UTF-8, one key ------------------------------------------------------------------


def test_a_utf8_idempotency_key_header_is_stored_as_written(acme: Any) -> None:
    wsgi_text = "clé-1".encode().decode("latin-1")  # how WSGI hands over a UTF-8 header
    response = acme.post(
        f"{BASE}reservations", reserve_body(), format="json", HTTP_IDEMPOTENCY_KEY=wsgi_text
    )
    assert response.status_code == 201, response.content
    assert Reservation.objects.get().idempotency_key == "clé-1"
    assert IdempotencyRecord.objects.get().key == "clé-1"


def test_a_header_that_is_not_utf8_is_refused(acme: Any) -> None:
    response = acme.post(
        f"{BASE}reservations", reserve_body(), format="json", HTTP_IDEMPOTENCY_KEY="\xff\xfe"
    )
    assert response.status_code == 400
    assert "UTF-8" in error(response)["message"]
    assert not Reservation.objects.exists()


def test_two_idempotency_key_headers_are_refused_not_joined(acme: Any) -> None:
    # WSGI servers join repeated headers with a comma: "dup1,dup2" is what the app sees.
    response = acme.post(
        f"{BASE}reservations", reserve_body(), format="json", HTTP_IDEMPOTENCY_KEY="dup1,dup2"
    )
    assert response.status_code == 400
    assert "one key" in error(response)["message"]
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("key", ["", " ", "\u200b"])
@pytest.mark.parametrize("path", ["reservations", "budgets", "kill-switches"])
def test_an_empty_idempotency_key_is_a_400_everywhere(operator: Any, key: str, path: str) -> None:
    response = operator.post(f"{BASE}{path}", {"idempotency_key": key}, format="json")
    assert response.status_code == 400
    assert "idempotency_key" in error(response)["message"]


def test_the_schema_says_an_identifier_is_not_empty(operator: Any) -> None:
    schema = operator.get(f"{BASE}schema/?format=json").json()
    reserve_schema = schema["components"]["schemas"]["ReserveRequest"]["properties"]
    for name in ("idempotency_key", "tenant", "end_user", "model"):
        assert reserve_schema[name]["minLength"] == 1, name
        assert reserve_schema[name]["pattern"], name


# --- Numbers ----------------------------------------------------------------------------------

BAD_INTEGERS = ["\u0661\u0660", "1_000", " 10 ", 1e3, 10.0, "1e3", "10.0", "-1", "+10", True]


@pytest.mark.parametrize("value", BAD_INTEGERS, ids=[repr(v) for v in BAD_INTEGERS])
@pytest.mark.parametrize("field", ["input_tokens", "max_output_tokens", "ttl_seconds"])
def test_integers_are_plain_digits_only(acme: Any, field: str, value: object) -> None:
    response = reserve(acme, **{field: value})
    assert response.status_code == 400, response.content
    assert error(response)["field"] == field
    assert not Reservation.objects.exists()


def test_integers_as_ascii_digit_strings_still_work(acme: Any) -> None:
    response = reserve(acme, max_output_tokens="1000", input_tokens="0")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("value", ["\u0661\u0660", "1_000", " 10 ", "1e3", "10.0"])
def test_quote_integers_are_plain_digits_only(acme: Any, value: str) -> None:
    query = {"provider": "fake", "model": "m30", "input_tokens": value, "max_output_tokens": 1}
    response = acme.get(f"{BASE}quote", query)
    assert response.status_code == 400
    assert error(response)["field"] == "input_tokens"


@pytest.mark.parametrize("ttl", [86_400_000_000_000, 10**30, 86_401])
def test_a_huge_ttl_on_reserve_is_a_400_not_a_500(acme: Any, ttl: int) -> None:
    response = reserve(acme, ttl_seconds=ttl)
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "ttl_seconds"


@pytest.mark.parametrize("ttl", ["250000000000", "86401", str(10**30)])
def test_quote_checks_the_ttl_range(acme: Any, ttl: str) -> None:
    query = {"provider": "fake", "model": "m30", "input_tokens": 0, "max_output_tokens": 1}
    response = acme.get(f"{BASE}quote", {**query, "ttl_seconds": ttl})
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "ttl_seconds"
    assert acme.get(f"{BASE}quote", {**query, "ttl_seconds": "86400"}).status_code == 200


def test_the_services_check_the_ttl_before_building_a_timedelta() -> None:
    seed()
    from llm_budgets.reads import quotes

    for call in (
        lambda: budgets.reserve(
            tenant="acme",
            provider="fake",
            model="m30",
            input_tokens=0,
            max_output_tokens=1,
            ttl=86_400_000_000_000,
        ),
        lambda: quotes.quote(
            tenant="acme",
            provider="fake",
            model="m30",
            input_tokens=0,
            max_output_tokens=1,
            ttl=250_000_000_000,
        ),
    ):
        with pytest.raises(InvalidUsage, match="ttl must be from 1 to"):
            call()


@pytest.mark.parametrize("tokens", [10**12, 10**100])
def test_huge_token_counts_are_refused(acme: Any, tokens: int) -> None:
    response = reserve(acme, input_tokens=tokens)
    assert response.status_code == 400
    assert error(response)["field"] == "input_tokens"


BAD_AMOUNTS = {
    "-0": "no sign",
    "-0.00": "no sign",
    "0.0000000000000000001": "decimal places",
    "1e3": "plain decimal",
    "1E+3": "plain decimal",
    " 10": "plain decimal",
    "\u0661\u0660": "plain decimal",
    "1_000": "plain decimal",
    "NaN": "plain decimal",
    "Infinity": "plain decimal",
}


@pytest.mark.parametrize("amount", list(BAD_AMOUNTS), ids=list(BAD_AMOUNTS))
def test_a_limit_is_plain_exact_and_unsigned(operator: Any, amount: str) -> None:
    before = list(Budget.objects.values_list("limit", flat=True))
    body = {"tenant": "acme", "window": "month", "amount": amount}
    response = operator.post(f"{BASE}budgets", body, format="json")
    assert response.status_code == 400, response.content
    assert error(response)["field"] == "amount"
    assert BAD_AMOUNTS[amount] in error(response)["message"]
    assert list(Budget.objects.values_list("limit", flat=True)) == before


def test_the_python_api_refuses_negative_zero_and_lost_precision() -> None:
    seed()
    for amount in (Decimal("-0"), "-0", Decimal("0.00000000001"), "5e1"):
        with pytest.raises(InvalidUsage):
            budgets.set_limit(tenant="acme", amount=amount, window="day")
    budgets.set_limit(tenant="acme", amount=Decimal("0.0000000001"), window="day")


# --- Bodies -----------------------------------------------------------------------------------

BODY_ENDPOINTS = ["reservations", "budgets", "kill-switches", "kill-switches/clear"]


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
def test_deeply_nested_json_is_a_400_not_a_500(operator: Any, path: str) -> None:
    for depth in (100, 950, 100_000):
        body = ("[" * depth + "]" * depth).encode()
        response = raw_post(operator, path, body)
        assert response.status_code == 400, (depth, response.content[:200])
        assert error(response)["code"] == "too_deeply_nested"


def test_nesting_inside_strings_does_not_count(acme: Any) -> None:
    response = reserve(acme, tags={"note": "[" * 200})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("path", BODY_ENDPOINTS)
def test_a_body_over_the_limit_is_a_json_413(operator: Any, path: str) -> None:
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        body = json.dumps({"prompt": "x" * 2000}).encode()
        response = raw_post(operator, path, body)
    assert response.status_code == 413, response.content[:200]
    assert error(response)["code"] == "request_too_large"


def test_a_20_mb_body_is_a_json_413(acme: Any) -> None:
    body = json.dumps(reserve_body(prompt="x" * 20_000_000)).encode()
    response = raw_post(acme, "reservations", body)
    assert response.status_code == 413
    assert error(response)["code"] == "request_too_large"
    assert not Reservation.objects.exists()


def test_a_body_that_is_not_utf8_is_refused(acme: Any) -> None:
    body = b'{"provider": "fake", "model": "m\xff30", "max_output_tokens": 1}'
    response = raw_post(acme, "reservations", body)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_encoding"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"end_user": "u\x00"}, "end_user"),
        ({"prompt": "hi\x00"}, "prompt"),
        ({"tags": {"k\x00": "v"}}, "tags"),
        ({"tags": {"k": "v\x00"}}, "tags.k"),
    ],
)
def test_nul_anywhere_in_a_body_is_a_400_naming_the_field(
    acme: Any, body: dict[str, Any], field: str
) -> None:
    response = raw_post(acme, "reservations", json.dumps(reserve_body(**body)).encode())
    assert response.status_code == 400
    assert field in error(response)["message"]


def test_json_constants_nan_and_infinity_are_refused(acme: Any) -> None:
    response = raw_post(acme, "reservations", b'{"model": "m30", "input_tokens": NaN}')
    assert response.status_code == 400


# --- Query strings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["offset=null", "limit=abc", "limit=-1", "limit=0", "offset=-5", "limit=1e2", "limit=5000"],
)
def test_pagination_parameters_are_checked(acme: Any, query: str) -> None:
    response = acme.get(f"{BASE}prices?{query}")
    assert response.status_code == 400, response.content
    assert error(response)["field"] == query.split("=")[0]


def test_good_pagination_still_works(acme: Any) -> None:
    response = acme.get(f"{BASE}prices?limit=1&offset=0")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1


@pytest.mark.parametrize(
    "path",
    [
        "prices?tenant=acme",
        "tenants/acme/status?tenant=other",
        "quote?model=m30&tenant_id=x",
        "reservations/00000000-0000-0000-0000-000000000000?x=1",
        "budgets?tenant=acme&secret=1",
    ],
)
def test_unknown_query_parameters_are_refused(operator: Any, path: str) -> None:
    response = operator.get(f"{BASE}{path}")
    assert response.status_code == 400, response.content
    assert "Unknown" in error(response)["message"]


def test_an_unknown_query_parameter_on_a_post_is_refused(acme: Any) -> None:
    response = acme.post(f"{BASE}reservations?tenant=other", reserve_body(), format="json")
    assert response.status_code == 400
    assert not Reservation.objects.exists()


def test_undecodable_query_string_is_not_an_end_user(acme: Any) -> None:
    # Django decodes an invalid UTF-8 query string with U+FFFD; that is refused, not stored.
    response = acme.get(f"{BASE}tenants/acme/status", QUERY_STRING="end_user=u%FF1")
    assert response.status_code == 400
    assert "not valid UTF-8" in error(response)["message"]


# --- The admin: the same normalisation, as a form error -------------------------------------


def test_the_admin_normalises_and_refuses_identifiers_like_the_api() -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    user = get_user_model().objects.create_user(
        username="root", password=None, is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:llm_budgets_tenant_add")
    form = {"name": "Acme", "timezone": "UTC", "billing_day": 1, "markup_percent": "0"}
    refused = client.post(url, {**form, "external_id": "acme\u200b", "_save": "1"})
    assert refused.status_code == 200
    assert "U+200B" in refused.content.decode()
    assert not Tenant.objects.exists()
    added = client.post(url, {**form, "external_id": "\uff41cme", "_save": "1"})
    assert added.status_code == 302, added.content.decode()[:500]
    assert list(Tenant.objects.values_list("external_id", flat=True)) == ["acme"]
