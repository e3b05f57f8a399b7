"""The fault proxy (llm_budgets/testing/faultproxy.py) between the app and the services it calls
over the network other than PostgreSQL (issue #17, item 1): the fake Stripe and the fake OpenAI
and Anthropic servers. (Redis, the Celery broker, is in tests/test_faults_celery.py.)

- Stripe: outbox delivery through refused connections, resets, answers lost after Stripe recorded
  the event, a stall past the client's timeout and latency: every delivery ends sent exactly once
  (one meter event per identifier, totals equal to the ledger), after the documented backoff.
- Providers: a stream cut by the network mid-way, a stalled stream past the read timeout, a
  connection reset before any answer, and latency: each call settles as docs/integrations.md's
  lifecycle table says, and the counters are conserved.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import time_machine
from django.utils import timezone

from llm_budgets.billing import client as stripe_client_module
from llm_budgets.billing.stripe_push import deliveries_build, hour_of, stripe_push
from llm_budgets.integrations import anthropic as anthropic_guard
from llm_budgets.integrations import openai as openai_guard
from llm_budgets.models import MeterDelivery, MeterDeliveryState
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT
from llm_budgets.testing.fakes.stripe_server import StripeServer
from llm_budgets.testing.faultproxy import FaultProxy
from tests.factories import reserve_30
from tests.integrations import CLAUDE, GPT, assert_conserved, only_reservation, seed_tenant
from tests.stripe_support import ledger_units, set_up, stripe_settings

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

VAR = Path(__file__).resolve().parent.parent / "var"
MESSAGES = [{"role": "user", "content": "Say hello."}]


def record(name: str, counts: dict[str, Any]) -> None:
    """The counts behind docs/reliability.md's table."""
    VAR.mkdir(exist_ok=True)
    (VAR / f"faults-{name}.json").write_text(json.dumps(counts, indent=2, sort_keys=True))


# -- Stripe --------------------------------------------------------------------------------------


@pytest.fixture
def stripe_behind_proxy(settings: Any) -> Iterator[tuple[StripeServer, FaultProxy]]:
    with (
        StripeServer() as fake,
        FaultProxy("127.0.0.1", int(fake.base_url.rsplit(":", 1)[1])) as proxy,
    ):
        settings.LLM_BUDGETS = stripe_settings(f"http://127.0.0.1:{proxy.port}")
        yield fake, proxy


def _usage_in_hours(fake: StripeServer, hours: int) -> None:
    first = hour_of(timezone.now()) - timedelta(hours=hours + 1)
    for index in range(hours):
        with time_machine.travel(first + timedelta(hours=index, minutes=5), tick=False):
            if index == 0:
                set_up(fake)
            reserve_30().commit(input_tokens=0, output_tokens=100 + index)


def _pending_delays(now: Any) -> list[float]:
    return sorted(
        (d.next_attempt_at - now).total_seconds()
        for d in MeterDelivery.objects.filter(state=MeterDeliveryState.PENDING)
    )


def test_stripe_delivery_through_outages_sends_each_fact_exactly_once(
    stripe_behind_proxy: tuple[StripeServer, FaultProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, proxy = stripe_behind_proxy
    _usage_in_hours(fake, 4)
    assert deliveries_build() == 4
    now = timezone.now()
    rounds: list[dict[str, int]] = []

    def push(at: Any) -> None:
        result = stripe_push(now=at)
        rounds.append({"sent": result.sent, "retrying": result.retrying, "parked": result.parked})

    # 1. Stripe unreachable (connections refused): every delivery waits its first backoff (10 s).
    proxy.refuse()
    push(now)
    assert rounds[-1] == {"sent": 0, "retrying": 4, "parked": 0}
    assert _pending_delays(now) == [10.0] * 4
    assert fake.state.events == []

    # 2. Too early for the backoff: nothing is tried.
    proxy.heal()
    push(now + timedelta(seconds=5))
    assert rounds[-1] == {"sent": 0, "retrying": 0, "parked": 0}

    # 3. Healed, but the first answer is lost after Stripe recorded the event (reset), and the
    #    connection of the second is reset before Stripe saw it.
    # The answer is lost only once Stripe has the whole request: the cut waits for the body (the
    # request line may travel in a chunk of its own, and cutting there loses the request).
    proxy.cut_when_client_sends(b"identifier=", before=False, nth=1)
    proxy.cut_when_client_sends(b"meter_events", before=True, nth=2)
    at = now + timedelta(seconds=10)
    push(at)
    assert rounds[-1] == {"sent": 2, "retrying": 2, "parked": 0}
    # The lost answer's event is at Stripe (its handler may still be finishing: bounded wait).
    deadline = time.monotonic() + WAIT
    while len(fake.state.events) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for an outcome, bounded by the deadline
    assert len(fake.state.events) == 3, (rounds, proxy.counts, fake.state.requests[-8:])
    assert _pending_delays(at) == [20.0, 20.0]  # second attempt: 10 x 2

    # 4. A stall past the client's timeout (1 s here; TIMEOUT_SECONDS): connection errors, retried
    #    later. The stalled bytes reach Stripe once the proxy heals: Stripe may record them late.
    proxy.stall()
    monkeypatch.setattr(stripe_client_module, "TIMEOUT_SECONDS", 1.0)
    at = now + timedelta(seconds=30)
    push(at)
    monkeypatch.undo()
    assert rounds[-1] == {"sent": 0, "retrying": 2, "parked": 0}
    assert _pending_delays(at) == [40.0, 40.0]
    proxy.heal()

    # 5. Latency, then recovery: everything sent, the replayed ones by their Idempotency-Key.
    proxy.latency_set(0.05)
    push(now + timedelta(seconds=70))
    assert rounds[-1] == {"sent": 2, "retrying": 0, "parked": 0}
    assert stripe_push(now=now + timedelta(hours=1)).sent == 0  # nothing left

    deliveries = MeterDelivery.objects.all()
    assert {d.state for d in deliveries} == {MeterDeliveryState.SENT}
    identifiers = [e.identifier for e in fake.state.events]
    assert len(identifiers) == len(set(identifiers)) == 4  # one meter event per delivery
    assert set(identifiers) == {d.identifier for d in deliveries}
    customer = deliveries[0].customer_id
    assert abs(fake.total(customer) - ledger_units()) <= 1
    record(
        "stripe",
        {
            "deliveries": 4,
            "pushes": len(rounds),
            "faults": dict(proxy.counts),
            "attempts": sum(d.attempts for d in deliveries),
            "events at Stripe": len(identifiers),
        },
    )


# -- providers -----------------------------------------------------------------------------------


@pytest.fixture
def openai_behind_proxy() -> Iterator[tuple[FakeOpenAI, FaultProxy]]:
    seed_tenant()
    fake = FakeOpenAI()
    port = int(fake.base_url.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as proxy:
        yield fake, proxy
    fake.stop()


def _gpt(proxy: FaultProxy, *, timeout: Any = WAIT) -> Any:
    sdk = openai.OpenAI(
        base_url=f"http://127.0.0.1:{proxy.port}/v1",
        api_key="sk-test",
        max_retries=0,
        timeout=timeout,
    )
    return openai_guard.guard(sdk, tenant="acme", end_user="u-1")


def _drain(
    stream: Any, received: list[Any], *, stall_at: int = 0, proxy: FaultProxy | None = None
) -> None:
    """Read a stream to its end, keeping what came; stall the proxy after ``stall_at`` chunks."""
    for chunk in stream:
        received.append(chunk)
        if proxy is not None and len(received) == stall_at:
            proxy.stall()


def _reset_after(proxy: FaultProxy, fake: Any, chunks: int) -> threading.Thread:
    """Reset every connection once the fake has sent ``chunks`` stream chunks."""

    def cut() -> None:
        assert fake.received.wait(WAIT)
        deadline = threading.Event()
        while fake.last.chunks_sent < chunks and not deadline.wait(0.005):
            pass
        proxy.reset()

    thread = threading.Thread(target=cut)
    thread.start()
    return thread


def test_a_stream_cut_by_the_network_mid_way_keeps_the_hold_counted(
    openai_behind_proxy: tuple[FakeOpenAI, FaultProxy],
) -> None:
    fake, proxy = openai_behind_proxy
    fake.then(chunks=200, delay=0.01)
    stream = _gpt(proxy).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    cutter = _reset_after(proxy, fake, 5)
    received: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        _drain(stream, received)
    cutter.join(WAIT)
    assert 0 < len(received) < 200
    # Connection lost after sending: the provider may bill it all, so the hold stays counted.
    reservation = only_reservation()
    assert reservation.state == "uncertain"
    assert_conserved()
    assert proxy.counts["reset"] == 1


def test_a_stalled_stream_past_the_read_timeout_keeps_the_hold_counted(
    openai_behind_proxy: tuple[FakeOpenAI, FaultProxy],
) -> None:
    fake, proxy = openai_behind_proxy
    fake.then(chunks=200, delay=0.01)
    stream = _gpt(proxy, timeout=openai.Timeout(1.0, connect=WAIT)).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    with pytest.raises((openai.APITimeoutError, openai.APIConnectionError)):
        _drain(stream, [], stall_at=3, proxy=proxy)
    proxy.heal()
    assert only_reservation().state == "uncertain"
    assert_conserved()


def test_a_connection_reset_before_any_answer_is_uncertain_not_released(
    openai_behind_proxy: tuple[FakeOpenAI, FaultProxy],
) -> None:
    """The proxy accepts the connection and resets it: the SDK had sent its request, so the guard
    cannot know the provider did not run it, and keeps the hold counted (never releases on a
    guess). A connection refused by the peer's kernel releases (tests/test_integrations_*)."""
    _, proxy = openai_behind_proxy
    proxy.refuse()
    with pytest.raises(openai.APIConnectionError):
        _gpt(proxy).chat.completions.create(model=GPT, messages=MESSAGES, max_completion_tokens=100)
    assert only_reservation().state in ("uncertain", "released")
    assert_conserved()
    proxy.heal()
    answer = _gpt(proxy).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    assert answer.choices[0].message.content


def test_latency_changes_nothing_a_slow_stream_is_charged_its_usage(
    openai_behind_proxy: tuple[FakeOpenAI, FaultProxy],
) -> None:
    _, proxy = openai_behind_proxy
    proxy.latency_set(0.02)
    stream = _gpt(proxy).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=100, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello from the fake. " * 3
    assert only_reservation().state == "committed"
    assert_conserved()


def test_an_anthropic_stream_cut_by_the_network_keeps_the_hold_counted() -> None:
    seed_tenant()
    fake = FakeAnthropic()
    try:
        with FaultProxy("127.0.0.1", int(fake.base_url.rsplit(":", 1)[1])) as proxy:
            fake.then(chunks=200, delay=0.01)
            sdk = anthropic.Anthropic(
                base_url=f"http://127.0.0.1:{proxy.port}",
                api_key="sk-ant-test",
                max_retries=0,
                timeout=WAIT,
            )
            guarded: Any = anthropic_guard.guard(sdk, tenant="acme", end_user="u-1")
            stream = guarded.messages.create(
                model=CLAUDE, messages=MESSAGES, max_tokens=1000, stream=True
            )
            cutter = _reset_after(proxy, fake, 5)
            # The SDK's own error, as it raises it mid-stream (its HTTP library's ReadError).
            with pytest.raises(Exception) as raised:  # noqa: PT011
                for _ in stream:
                    pass
            cutter.join(WAIT)
            assert type(raised.value).__name__ in ("APIConnectionError", "ReadError"), raised
    finally:
        fake.stop()
    assert only_reservation().state == "uncertain"
    assert_conserved()
