"""API keys under abuse (issue #17 items 6 and 8): failed attempts throttled per source across
processes, the per-key throttle shared by every process, a strict header, a constant-cost check
of unknown prefixes, revocation effective on the next request."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from django.test import override_settings

from llm_budgets.api.keys import api_key_revoke
from llm_budgets.models import ApiKey
from tests.api import BASE, client_for, new_key
from tests.factories import seed
from tests.servers import web_processes

pytestmark = pytest.mark.django_db

WRONG = "Api-Key abcdefgh.wrongwrongwrongwrongwrongwrongwr"


def status_path() -> str:
    return f"{BASE}tenants/acme/status"


def attempt(header: str | None, remote: str = "10.0.0.1") -> Any:
    client = client_for(None)
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client.get(status_path(), REMOTE_ADDR=remote)


@override_settings(LLM_BUDGETS={"API_AUTH_FAILURE_RATE": "5/minute"})
def test_failed_attempts_are_throttled_per_source() -> None:
    seed()
    good = new_key("acme")
    codes = [attempt(WRONG).status_code for _ in range(8)]
    assert codes == [401] * 5 + [429] * 3
    blocked = attempt(WRONG)
    assert int(blocked["Retry-After"]) >= 1
    assert blocked.json()["error"]["code"] == "throttled"
    # Blocked before the key is looked at: even the right key is refused from that source...
    assert attempt(f"Api-Key {good}").status_code == 429
    # ...while another source is unaffected.
    assert attempt(f"Api-Key {good}", remote="10.0.0.2").status_code == 200
    assert attempt(WRONG, remote="10.0.0.2").status_code == 401


@override_settings(LLM_BUDGETS={"API_AUTH_FAILURE_RATE": "3/minute"})
def test_a_forged_forwarded_for_header_does_not_make_a_new_source() -> None:
    seed()
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=WRONG)
    codes = [
        client.get(
            status_path(), REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR=f"1.2.3.{i}"
        ).status_code
        for i in range(5)
    ]
    assert codes == [401, 401, 401, 429, 429]


@pytest.mark.parametrize(
    "header",
    [
        "api-key {key}",
        "API-KEY {key}",
        "Api-Key  {key}",
        "Api-Key {key} ",
        " Api-Key {key}",
        "Api-Key\t{key}",
        "Api-Key {key} extra",
    ],
)
def test_the_header_is_strict(header: str) -> None:
    seed()
    key = new_key("acme")
    response = attempt(header.format(key=key))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "malformed_api_key"
    assert attempt(f"Api-Key {key}").status_code == 200


def test_an_unknown_prefix_costs_a_hash_comparison_too() -> None:
    seed()
    new_key("acme")
    generator = ApiKey.objects.key_generator
    with mock.patch.object(generator, "verify", wraps=generator.verify) as verify:
        assert attempt("Api-Key zzzzzzzz.secretsecretsecretsecretsecretsec").status_code == 401
    assert verify.call_count == 1


def test_revocation_is_effective_on_the_next_request() -> None:
    seed()
    key = new_key("acme")
    assert attempt(f"Api-Key {key}").status_code == 200
    api_key_revoke(ApiKey.objects.get(prefix=key.split(".")[0]), actor="test")
    response = attempt(f"Api-Key {key}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "api_key_revoked"


@pytest.mark.django_db(transaction=True)
def test_both_throttles_count_across_processes(tmp_path: Path) -> None:
    """Two web processes, one database: the limits are global, not per process."""
    seed()
    key = new_key("acme")
    settings = {"API_THROTTLE_RATE": "10/minute", "API_AUTH_FAILURE_RATE": "4/minute"}
    with web_processes(2, tmp_path, llm_budgets=settings) as webs:
        path = "/api/llm-budgets/v1/tenants/acme/status"
        good = {"Authorization": f"Api-Key {key}"}
        codes = [
            httpx.get(f"{webs[i % 2].url}{path}", headers=good, timeout=30).status_code
            for i in range(14)
        ]
        assert codes == [200] * 10 + [429] * 4, codes
        bad = {"Authorization": WRONG}
        codes = [
            httpx.get(f"{webs[i % 2].url}{path}", headers=bad, timeout=30).status_code
            for i in range(6)
        ]
        assert codes == [401] * 4 + [429] * 2, codes


def test_old_counter_windows_are_deleted() -> None:
    from llm_budgets.api.throttling import counter_hit
    from llm_budgets.models import RateCounter

    day = 86400
    assert counter_hit("a", duration=60, now=0) == 1
    assert counter_hit("a", duration=60, now=30) == 2
    assert counter_hit("b", duration=60, now=30) == 1
    assert counter_hit("a", duration=60, now=61) == 1  # a new window: a's old one goes
    assert sorted(RateCounter.objects.values_list("key", "window_start")) == [("a", 60), ("b", 0)]
    assert counter_hit("c", duration=60, now=3 * day) == 1  # anyone's stale windows go
    assert list(RateCounter.objects.values_list("key", flat=True)) == ["c"]
