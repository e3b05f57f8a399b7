"""API keys under abuse (issue #17 items 6 and 8): failed attempts throttled per source across
processes, the per-key throttle shared by every process, a strict header, a constant-cost check
of unknown prefixes, revocation effective on the next request."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from llm_budgets.api.throttling import window_now
from llm_budgets.control.api_keys import api_key_revoke
from llm_budgets.models import ApiKey
from tests.api import BASE, client_for, new_key
from tests.factories import seed
from tests.servers import web_processes

pytestmark = pytest.mark.django_db

WRONG = "Api-Key abcdefgh.wrongwrongwrongwrongwrongwrongwr"
BAD = {"Authorization": WRONG}


def status_path() -> str:
    return f"{BASE}tenants/acme/status"


@pytest.fixture
def one_window() -> Any:
    """One throttle window throughout: the counters' clock stands still, so a count of attempts
    never straddles a minute boundary (on a slow machine it did)."""
    with time_machine.travel(timezone.now() + timedelta(seconds=1), tick=False):
        yield


def attempt(header: str | None, remote: str = "10.0.0.1") -> Any:
    client = client_for(None)
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client.get(status_path(), REMOTE_ADDR=remote)


@override_settings(LLM_BUDGETS={"API_AUTH_FAILURE_RATE": "5/minute"})
@pytest.mark.usefixtures("one_window")
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
@pytest.mark.usefixtures("one_window")
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


@pytest.mark.parametrize("refused", ["revoked", "expired"])
def test_a_revoked_or_expired_key_is_throttled_on_its_own(refused: str) -> None:
    """20 refusals of one revoked (or expired) key behind a shared egress address: that key gets
    429, every other key from the address keeps working (issue 22 item 5)."""
    seed()
    bad, good = new_key("acme", name="old service"), new_key("acme", name="other service")
    bad_key = ApiKey.objects.get(prefix=bad.split(".")[0])
    if refused == "revoked":
        api_key_revoke(bad_key, actor="test")
    else:
        ApiKey.objects.filter(pk=bad_key.pk).update(expiry_date=timezone.now())
    # One throttle window throughout (the counters' clock stands still; no minute boundary).
    with time_machine.travel(timezone.now() + timedelta(seconds=1), tick=False):
        codes = [attempt(f"Api-Key {bad}").status_code for _ in range(22)]
        assert codes == [401] * 20 + [429] * 2
        assert attempt(f"Api-Key {bad}").json()["error"]["code"] == "throttled"
        assert attempt(f"Api-Key {good}").status_code == 200
        # Guessing from that address is still counted per source, from zero.
        assert [attempt(WRONG).status_code for _ in range(21)] == [401] * 20 + [429]
        assert attempt(f"Api-Key {good}").status_code == 429


@pytest.mark.parametrize(
    ("trusted", "forwarded", "source"),
    [
        (0, "1.2.3.4", "10.0.0.9"),  # no proxy trusted: the header is the client's word
        (1, "1.2.3.4", "1.2.3.4"),
        (1, "6.6.6.6, 1.2.3.4", "1.2.3.4"),  # a forged entry left of the proxy's is ignored
        (2, "6.6.6.6, 1.2.3.4, 172.16.0.1", "1.2.3.4"),
        (2, "1.2.3.4", "10.0.0.9"),  # fewer entries than proxies: not through them all
        (1, None, "10.0.0.9"),
    ],
)
def test_the_source_address_follows_trusted_proxies(
    trusted: int, forwarded: str | None, source: str
) -> None:
    from rest_framework.test import APIRequestFactory

    from llm_budgets.api.throttling import source_of

    extra = {} if forwarded is None else {"HTTP_X_FORWARDED_FOR": forwarded}
    request = APIRequestFactory().get("/", REMOTE_ADDR="10.0.0.9", **extra)
    with override_settings(LLM_BUDGETS={"TRUSTED_PROXIES": trusted}):
        assert source_of(request) == source


@override_settings(LLM_BUDGETS={"API_AUTH_FAILURE_RATE": "3/minute", "TRUSTED_PROXIES": 1})
@pytest.mark.usefixtures("one_window")
def test_behind_one_proxy_each_client_is_its_own_source() -> None:
    seed()
    good = new_key("acme")

    def through_proxy(header: str, client: str) -> int:
        forwarded = {"HTTP_X_FORWARDED_FOR": f"9.9.9.9, {client}"}  # 9.9.9.9: forged
        api = client_for(None)
        api.credentials(HTTP_AUTHORIZATION=header)
        return api.get(status_path(), REMOTE_ADDR="10.0.0.1", **forwarded).status_code

    assert [through_proxy(WRONG, "1.1.1.1") for _ in range(4)] == [401, 401, 401, 429]
    assert through_proxy(f"Api-Key {good}", "1.1.1.1") == 429
    assert through_proxy(f"Api-Key {good}", "2.2.2.2") == 200  # same proxy, another client


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
    settings = {"API_THROTTLE_RATE": "10/minute", "API_AUTH_FAILURE_RATE": "4/minute"}
    with web_processes(2, tmp_path, llm_budgets=settings) as webs:
        path = "/api/llm-budgets/v1/tenants/acme/status"

        def burst(headers: dict[str, str], count: int, source: str) -> list[int] | None:
            """The codes of ``count`` requests alternating between the processes, from the
            loopback address ``source``; None when they straddled a minute (a new window)."""
            started = window_now(60)
            with httpx.Client(transport=httpx.HTTPTransport(local_address=source)) as http:
                codes = [
                    http.get(f"{webs[i % 2].url}{path}", headers=headers, timeout=30).status_code
                    for i in range(count)
                ]
            return codes if window_now(60) == started else None

        # A fresh key and source address for each try: a try that straddled a window boundary
        # says nothing, and its hits must not count in the next.
        tries = []
        for n in range(3):
            good = {"Authorization": f"Api-Key {new_key('acme')}"}
            tries.append((burst(good, 14, f"127.0.0.{10 + n}"), burst(BAD, 6, f"127.0.0.{20 + n}")))
            if None not in tries[-1]:
                break
        codes_good, codes_bad = tries[-1]
        assert codes_good == [200] * 10 + [429] * 4, tries
        assert codes_bad == [401] * 4 + [429] * 2, tries


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
