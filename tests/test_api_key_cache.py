"""With API_KEY_CACHE_SECONDS set, API keys are read once per process and kept that long:
authentication then costs no database read; revocation in this process is seen at once, elsewhere
within the TTL. The default (0) reads the key on every request, so a revocation anywhere takes
effect on the next request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from llm_budgets.api import authentication
from llm_budgets.checks import check_settings
from llm_budgets.control.api_keys import api_key_revoke
from llm_budgets.models import ApiKey
from tests.api import BASE, client_for, new_key
from tests.factories import seed

pytestmark = pytest.mark.django_db

TABLE = ApiKey._meta.db_table


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[list[float]]:
    settings.LLM_BUDGETS = {"API_KEY_CACHE_SECONDS": 5}
    now = [1000.0]
    monkeypatch.setattr(authentication, "_clock", lambda: now[0])
    authentication._keys.clear()
    yield now
    authentication._keys.clear()


def key_reads(key: str | None) -> tuple[int, int]:
    """(status of GET status, how many reads of the key table it made)."""
    with CaptureQueriesContext(connection) as queries:
        response = client_for(key).get(f"{BASE}tenants/acme/status")
    return response.status_code, sum(TABLE in q["sql"] for q in queries.captured_queries)


def test_a_key_is_read_once_then_served_from_the_process() -> None:
    seed()
    key = new_key("acme")
    assert key_reads(key) == (200, 1)
    assert key_reads(key) == (200, 0)


def test_a_wrong_secret_for_a_known_prefix_is_refused_without_a_read() -> None:
    seed()
    key = new_key("acme")
    key_reads(key)
    assert key_reads(key[:-4] + "XXXX") == (401, 0)


def test_an_unknown_prefix_is_remembered_and_a_new_key_is_not_refused() -> None:
    seed()
    assert key_reads("nosuchpx.secret") == (401, 1)
    assert key_reads("nosuchpx.secret") == (401, 0)
    key = new_key("acme")  # saving a key forgets the remembered prefixes
    assert key_reads(key) == (200, 1)


def test_revoking_in_this_process_takes_effect_at_once() -> None:
    seed()
    key = new_key("acme")
    key_reads(key)
    api_key_revoke(ApiKey.objects.get(prefix=key.partition(".")[0]), reason="leaked")
    assert key_reads(key)[0] == 401


def test_a_revocation_elsewhere_is_seen_within_the_ttl(clock: list[float]) -> None:
    seed()
    key = new_key("acme")
    key_reads(key)
    # Another process revokes it: no signal reaches this one.
    ApiKey.objects.filter(prefix=key.partition(".")[0]).update(revoked=True)
    clock[0] += 4.9
    assert key_reads(key)[0] == 200
    clock[0] += 0.2  # past the 5 s set above
    assert key_reads(key) == (401, 1)


@override_settings(LLM_BUDGETS={"API_KEY_CACHE_SECONDS": 0})
def test_zero_reads_the_key_on_every_request() -> None:
    seed()
    key = new_key("acme")
    assert key_reads(key) == (200, 1)
    assert key_reads(key) == (200, 1)


@override_settings(LLM_BUDGETS={})
def test_by_default_a_revocation_elsewhere_takes_effect_on_the_next_request() -> None:
    seed()
    key = new_key("acme")
    assert key_reads(key) == (200, 1)
    ApiKey.objects.filter(prefix=key.partition(".")[0]).update(revoked=True)
    assert key_reads(key) == (401, 1)


def test_a_flood_of_prefixes_cannot_grow_the_cache_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(authentication, "_MAX_CACHED", 3)
    for i in range(10):
        key_reads(f"made{i:04d}.up")
        assert len(authentication._keys) <= 3


@pytest.mark.parametrize("value", [-1, 301, 1.5, "5", None, True])
def test_the_ttl_is_checked(value: object) -> None:
    with override_settings(LLM_BUDGETS={"API_KEY_CACHE_SECONDS": value}):
        assert [m.id for m in check_settings()] == ["llm_budgets.E063"]
