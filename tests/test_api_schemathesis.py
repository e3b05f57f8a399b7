"""Schemathesis against the served OpenAPI schema, on a live (threaded) test server: generated
requests for every operation must never cause a 5xx and every response must match the schema.
At least 1,000 generated cases per run (counted, not assumed), plus a stateful run that follows
the schema's links (a reservation's id into commit, release, extend, uncertain, status).

(Schemathesis' own pytest plugin does not run on pytest 9 yet, so the test drives Hypothesis
directly, one strategy per operation.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
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

from llm_budgets.jobs.records import job_finished
from llm_budgets.schedule import jobs_installed
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import seed

# Two sizes. "full": per operation and mode, 3 modes x 14 operations x up to 40 cases, counted
# below (>= 1,000 in all), plus 15 stateful scenarios; it takes minutes, so it runs in the slow
# fault leg (`make test-faults`, on PostgreSQL). "smoke": the same checks at a fifth of the size in
# every leg, so a schema/server disagreement still fails the fast suite on both databases.
SIZES = [
    pytest.param(8, 60, 4, id="smoke"),
    pytest.param(40, 340, 15, id="full", marks=pytest.mark.faults),
]
STATEFUL_STEPS = 25


@pytest.fixture(autouse=True)
def _jobs_on_time(db: None) -> None:
    """A deployment whose scheduler runs: otherwise /health rightly fails its jobs check (503)
    once the test database is older than twice the sweep's interval plus the slack, and this
    file's verdict would hang on how long the suite has run."""
    for job in jobs_installed():
        job_finished(job.task)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def fuzz(strategy: Any, headers: dict[str, str], checks: list[Any], examples: int) -> int:
    """Run the cases; returns how many were sent."""
    sent = 0

    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        nonlocal sent
        sent += 1
        case.call_and_validate(headers=headers, checks=checks)

    check()
    return sent


def record(name: str, count: int) -> None:
    """How many cases ran, in var/schemathesis-cases.json (figures of docs/reliability.md)."""
    out = Path(__file__).resolve().parent.parent / "var" / "schemathesis-cases.json"
    out.parent.mkdir(exist_ok=True)
    try:
        counts = json.loads(out.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        counts = {}
    # Written whole, then renamed over: CI's legs record side by side.
    staged = out.with_name(f"{out.name}.{os.getpid()}")
    staged.write_text(json.dumps({**counts, name: count}, indent=2, sort_keys=True))
    os.replace(staged, out)


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
@pytest.mark.parametrize(("examples", "min_cases", "scenarios"), SIZES)
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
    live_server: Any,
    key_kind: str,
    mode: GenerationMode,
    real_paths: bool,
    examples: int,
    min_cases: int,
    scenarios: int,
) -> None:
    seed(limit="1000")
    key = new_key(None if key_kind == "operator" else "acme")
    reserved = client_for(key).post(
        f"{BASE}reservations",
        # It holds the tool call the known-good commit reports (usage beyond a hold is a 422).
        reserve_body(tenant="acme", max_tool_calls={"web_search": 1}),
        format="json",
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
        cases = 0
        for operation in operations:
            if mode == GenerationMode.NEGATIVE and not (
                list(operation.iter_parameters()) or list(operation.body)
            ):
                continue  # nothing to make invalid (GET health)
            names = {p.name for p in operation.iter_parameters() if p.location == "path"}
            fixed = {k: v for k, v in real.items() if k in names} if real_paths else None
            cases += fuzz(
                operation.as_strategy(generation_mode=mode, path_parameters=fixed),
                headers,
                CHECKS,
                examples,
            )
    record(f"{key_kind}-{mode.value}-{examples}", cases)
    assert cases >= min_cases, cases


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("examples", "min_cases", "scenarios"), SIZES)
def test_stateful_links_hold_the_schema(
    live_server: Any, examples: int, min_cases: int, scenarios: int
) -> None:
    """Follow the links: create a reservation, then act on it by its id, as a client would."""
    seed(limit="100000")
    key = new_key("acme")
    schema = schemathesis.openapi.from_url(f"{live_server.url}{BASE}schema/?format=json")
    links = schema.raw_schema["paths"][f"{BASE}reservations"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} >= {
        "reservations_commit",
        "reservations_release",
        "reservations_extend",
        "reservations_uncertain",
        "reservations_retrieve",
        "tenants_status",
    }
    steps: list[tuple[str, int]] = []

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": {"Authorization": f"Api-Key {key}"}}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            steps.append((case.operation.label, response.status_code))
            case.validate_response(response, checks=CHECKS)

    with override_settings(LLM_BUDGETS={"API_THROTTLE_RATE": None}):
        Workflow.run(
            settings=settings(
                max_examples=scenarios,
                stateful_step_count=STATEFUL_STEPS,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
        )
    record(f"stateful steps-{scenarios}", len(steps))
    assert not [step for step in steps if step[1] >= 500]
    followed = {label for label, _ in steps if "{reservation_id}" in label}
    assert followed, steps[:50]
