"""Schemathesis against the served OpenAPI schema, on a live (threaded) test server: generated
requests for every operation must never cause a 5xx and every response must match the schema.

(Schemathesis' own pytest plugin does not run on pytest 9 yet, so the test drives Hypothesis
directly, one strategy per operation.)"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

# Bounded so CI stays well under two minutes; every operation still gets varied input.
EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def fuzz(strategy: Any, headers: dict[str, str], checks: list[Any]) -> None:
    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=checks)

    check()


def known_good_cases(operations: dict[str, Any], reservation_id: str) -> list[Any]:
    quote = operations[f"GET {BASE}quote"]
    create = operations[f"POST {BASE}reservations"]
    commit = operations[f"POST {BASE}reservations/{{reservation_id}}/commit"]
    request = {"provider": "fake", "model": "m30", "max_output_tokens": 1000}
    usage = {
        "input_tokens": 10,
        "cached_input_tokens": 4,
        "cache_write_tokens": 2,
        "cache_write_1h_tokens": 1,
        "output_tokens": 5,
        "reasoning_tokens": 2,
        "tool_calls": {"web_search": 1},
    }
    return [
        ("quote", quote.Case(query={**request, "input_tokens": 0, "end_user": "u-1"}), 200),
        (
            "quote messages",
            quote.Case(query={**request, "messages": '[{"role": "user", "content": "hi"}]'}),
            200,
        ),
        ("reserve prompt", create.Case(body={**request, "prompt": "hi"}), 201),
        (
            "commit",
            commit.Case(path_parameters={"reservation_id": reservation_id}, body=usage),
            200,
        ),
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("key_kind", "mode", "real_paths"),
    [
        ("operator", GenerationMode.POSITIVE, False),
        ("operator", GenerationMode.NEGATIVE, False),
        # Real ids in the paths, so generated bodies reach commit, extend, release and status.
        ("tenant", GenerationMode.POSITIVE, True),
    ],
)
def test_the_api_honours_its_schema(
    live_server: Any, key_kind: str, mode: GenerationMode, real_paths: bool
) -> None:
    seed(limit="1000")
    key = new_key(None if key_kind == "operator" else "acme")
    reserved = client_for(key).post(
        f"{BASE}reservations", reserve_body(tenant="acme"), format="json"
    )
    real = {"reservation_id": reserved.json()["id"], "external_id": "acme"}
    headers = {"Authorization": f"Api-Key {key}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}{BASE}schema/?format=json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10

    with override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": None}):
        if real_paths:
            # Random models are unpriced (422): check the success shapes once with real input.
            by_id = {operation.label: operation for operation in operations}
            for label, case, status in known_good_cases(by_id, real["reservation_id"]):
                response = case.call_and_validate(headers=headers, checks=CHECKS)
                assert response.status_code == status, (label, response.text)
        for operation in operations:
            if mode == GenerationMode.NEGATIVE and not (
                list(operation.iter_parameters()) or list(operation.body)
            ):
                continue  # nothing to make invalid (GET health)
            names = {p.name for p in operation.iter_parameters() if p.location == "path"}
            fixed = {k: v for k, v in real.items() if k in names} if real_paths else None
            fuzz(
                operation.as_strategy(generation_mode=mode, path_parameters=fixed), headers, CHECKS
            )
