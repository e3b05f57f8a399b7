"""Issue #39 item 2: the guard charges what the provider billed. Usage the provider reports is
recorded even beyond the hold (overage, audited, a WARNING event, a metric), never refused, and
only the guards can commit that way; a stream the caller stops early is charged the worst case of
what it could not see (thinking or reasoning, server tools it showed starting); an answer's own
billing modifiers (tier, speed, region) are charged as it reports them.

The SDK paths use the real ``openai`` and ``anthropic`` clients against the fakes on 127.0.0.1;
new stream shapes come from fakes subclassed here."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from asgiref.sync import async_to_sync
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test
from prometheus_client.parser import text_string_to_metric_families

from llm_budgets import metrics
from llm_budgets.engine import settlement
from llm_budgets.exceptions import UsageExceedsHold
from llm_budgets.integrations import anthropic as guarded_anthropic
from llm_budgets.integrations import openai as guarded_openai
from llm_budgets.integrations.guarding import SEARCH_CONTENT_TOKENS_PER_USE
from llm_budgets.models import AuditEvent, Counter, Reservation, ReservationState, UsageRecord
from llm_budgets.pricing.costs import actual_cost
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT, Behaviour, Seen
from llm_budgets.usage import from_anthropic, from_openai, usage_validate
from tests.api import BASE, client_for, new_key
from tests.factories import price_fake, reserve_30, seed
from tests.integrations import (
    CLAUDE,
    GPT,
    assert_conserved,
    charge_line,
    only_reservation,
    seed_tenant,
    tenant_counter,
)
from tests.test_ledger_machine import HOSTS, HostTransactionMachine, in_host

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "Say hello."}]


def underestimates() -> float:
    """The guard_underestimate metric, summed over its labels."""
    total = 0.0
    for family in text_string_to_metric_families(metrics.metrics_text().decode()):
        for sample in family.samples:
            if sample.name == "llm_budgets_guard_underestimate_total":
                total += sample.value
    return total


def assert_within_limit_plus_overage() -> None:
    """Invariant 1 as the reconcile checks it: the only excess is recorded overage."""
    for counter in Counter.objects.all():
        overage = sum((line.overage for line in UsageRecord.objects.all()), Decimal(0))
        assert counter.spent + counter.reserved <= counter.budget.limit + overage


# -- the ledger: the guards' commit ------------------------------------------------------------


def test_provider_usage_beyond_the_hold_is_charged_as_overage_audited_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed(limit="100")
    hold = reserve_30()  # 1000 output tokens at 30 per million-thousand: 30
    before = underestimates()
    usage = usage_validate(input_tokens=5000, output_tokens=2000)  # past the input tolerance too
    with caplog.at_level(logging.WARNING, logger="llm_budgets.events"):
        result = settlement.reservation_commit_provider_usage(hold.id, usage=usage)
    assert (result.state, result.cost, result.overage) == ("committed", Decimal(60), Decimal(30))
    line = UsageRecord.objects.get(reservation_id=hold.id)
    assert (line.cost, line.overage, line.output_tokens) == (Decimal(60), Decimal(30), 2000)
    audit = AuditEvent.objects.get(action="guard.underestimate")
    assert audit.target == f"reservation {hold.id}"
    assert (audit.before, audit.after["cost"]) == ({"held": "30.0000000000"}, "60.0000000000")
    event = next(r for r in caplog.records if getattr(r, "event", "") == "guard.underestimate")
    assert event.levelno == logging.WARNING
    assert event.reason == "output_tokens"
    assert (Decimal(event.held), Decimal(event.cost)) == (30, 60)
    assert underestimates() == before + 1
    counter = Counter.objects.get()
    assert (counter.spent, counter.reserved) == (Decimal(60), Decimal(0))
    assert_within_limit_plus_overage()


def test_provider_usage_within_the_hold_is_not_flagged() -> None:
    seed(limit="100")
    hold = reserve_30()
    before = underestimates()
    usage = usage_validate(input_tokens=0, output_tokens=500)
    assert settlement.reservation_commit_provider_usage(hold.id, usage=usage).cost == 15
    assert not AuditEvent.objects.filter(action="guard.underestimate").exists()
    assert underestimates() == before


def test_the_guards_commit_is_exactly_once_whichever_path_settles_again() -> None:
    seed(limit="100")
    hold = reserve_30()
    usage = usage_validate(input_tokens=0, output_tokens=2000)
    first = settlement.reservation_commit_provider_usage(hold.id, usage=usage)
    again = settlement.reservation_commit_provider_usage(hold.id, usage=usage)
    public = settlement.reservation_commit(hold.id, input_tokens=0, output_tokens=1)
    assert first.cost == again.cost == public.cost == Decimal(60)
    assert UsageRecord.objects.count() == 1
    assert AuditEvent.objects.filter(action="guard.underestimate").count() == 1


def test_a_late_provider_commit_after_expiry_trues_the_estimate_up_past_the_hold() -> None:
    seed(limit="100")
    hold = reserve_30()
    assert settlement.reservation_expire(hold.id, now=hold.expires_at)
    usage = usage_validate(input_tokens=0, output_tokens=3000)
    result = settlement.reservation_commit_provider_usage(hold.id, usage=usage)
    assert (result.cost, result.overage) == (Decimal(90), Decimal(60))
    assert Counter.objects.get().spent == Decimal(90)
    assert_within_limit_plus_overage()


def test_a_callers_own_usage_keeps_the_plausibility_rule_in_python_and_over_rest() -> None:
    seed(limit="100")
    hold = reserve_30()
    with pytest.raises(UsageExceedsHold):
        hold.commit(input_tokens=0, output_tokens=2000)
    acme = client_for(new_key("acme"))
    url = f"{BASE}reservations/{hold.id}/commit"
    usage = {"input_tokens": 0, "output_tokens": 2000}
    assert acme.post(url, usage, format="json").status_code == 422
    for flag in ({"source": "provider"}, {"provider_usage": True}, {"service_tier": ""}):
        assert acme.post(url, {**usage, **flag}, format="json").status_code == 400
    assert Reservation.objects.get().state == "held"
    assert not UsageRecord.objects.exists()


# -- the SDKs: provider usage past the hold ----------------------------------------------------


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    seed_tenant()
    server = FakeOpenAI()
    yield server
    server.stop()


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    seed_tenant()
    server = FakeAnthropic()
    yield server
    server.stop()


def _openai(base_url: str) -> Any:
    sdk = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=WAIT)
    return guarded_openai.guard(sdk, tenant="acme", end_user="u-1")


def _anthropic(base_url: str) -> Any:
    sdk = anthropic.Anthropic(base_url=base_url, api_key="sk-test", max_retries=0, timeout=WAIT)
    return guarded_anthropic.guard(sdk, tenant="acme", end_user="u-1")


def test_more_input_than_held_is_charged_as_the_provider_reported_it(
    fake_openai: FakeOpenAI,
) -> None:
    """The provider counts what the guard cannot see (a stored prompt, a longer chain): its count
    is the bill. Before: UsageExceedsHold, logged, and the hold later charged as its estimate."""
    fake_openai.usage = {**fake_openai.usage, "prompt_tokens": 50_000, "cached_tokens": 0}
    _openai(fake_openai.base_url).chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=100
    )
    reservation = only_reservation()
    line = charge_line(reservation)
    assert (reservation.state, line.input_tokens) == ("committed", 50_000)
    assert line.cost == 50_000 * 1 + 12 * 2  # a token costs a unit of input, two of output
    assert line.overage == line.cost - reservation.amount > 0
    assert AuditEvent.objects.filter(action="guard.underestimate").count() == 1
    assert_conserved()
    assert_within_limit_plus_overage()


@pytest.mark.parametrize(
    ("billed", "tier", "multiplier"),
    [
        ({"speed": "fast"}, "fast", Decimal(6)),
        ({"inference_geo": "us"}, "geo_us", Decimal("1.1")),
        ({"speed": "fast", "inference_geo": "us"}, "fast+geo_us", Decimal("6.6")),
    ],
)
def test_an_anthropic_answer_is_charged_at_the_speed_and_region_its_usage_reports(
    fake_anthropic: FakeAnthropic, billed: dict[str, str], tier: str, multiplier: Decimal
) -> None:
    """``usage.speed`` and ``usage.inference_geo`` say what was billed, however it was asked
    (here through ``extra_body``, which the guard did not price before issue #39)."""
    fake_anthropic.usage = {"input_tokens": 30, "output_tokens": 15, **billed}
    asked = {k: v for k, v in billed.items() if k == "speed"}
    _anthropic(fake_anthropic.base_url).messages.create(
        model=CLAUDE, max_tokens=100, messages=MESSAGES, extra_body=asked
    )
    line = charge_line(only_reservation())
    assert (line.service_tier, line.cost) == (tier, (30 * 1 + 15 * 2) * multiplier)
    assert_conserved()


# -- the SDKs: streams stopped early -----------------------------------------------------------


def _sse(kind: str, body: dict[str, Any]) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **body})


SEARCH_RESULT_TOKENS = 15_000


class SearchingAnthropic(FakeAnthropic):
    """A stream that runs a web search before it answers, as Anthropic streams one: the
    ``server_tool_use`` block and its result first, then the text; the search's fee and its
    result tokens only in the closing ``message_delta``."""

    def final_usage(self, seen: Seen) -> dict[str, Any]:
        usage = self._usage(seen)
        return {**usage, "input_tokens": usage["input_tokens"] + SEARCH_RESULT_TOKENS}

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        start = {k: v for k, v in self._usage(seen).items() if k != "server_tool_use"}
        yield _sse("message_start", {"message": self._message(seen, [], start)})
        use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
        yield _sse("content_block_start", {"index": 0, "content_block": use})
        query = {"type": "input_json_delta", "partial_json": '{"query": "news"}'}
        yield _sse("content_block_delta", {"index": 0, "delta": query})
        yield _sse("content_block_stop", {"index": 0})
        result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
        yield _sse("content_block_start", {"index": 1, "content_block": result})
        yield _sse("content_block_stop", {"index": 1})
        yield _sse(
            "content_block_start", {"index": 2, "content_block": {"type": "text", "text": ""}}
        )
        for _ in range(behaviour.chunks):
            text = {"type": "text_delta", "text": behaviour.text}
            yield _sse("content_block_delta", {"index": 2, "delta": text})
        yield _sse("content_block_stop", {"index": 2})
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        yield _sse("message_delta", {"delta": delta, "usage": self.final_usage(seen)})
        yield _sse("message_stop", {})


@pytest.fixture
def searching() -> Iterator[SearchingAnthropic]:
    seed_tenant(limit="100000000")
    server = SearchingAnthropic()
    yield server
    server.stop()


def _bill(reservation: Reservation, usage: Any) -> Decimal:
    assert reservation.price is not None
    return actual_cost(reservation.price, usage, at=reservation.created_at)


@pytest.mark.parametrize("helper", [False, True])
def test_a_search_stream_stopped_at_its_first_text_is_charged_the_search(
    searching: SearchingAnthropic, helper: bool
) -> None:
    """29x under before: the fee and the result tokens come in ``message_delta``, never read."""
    searching.then(chunks=200, delay=0.01)
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    kwargs = {"model": CLAUDE, "max_tokens": 1000, "messages": MESSAGES, "tools": [search]}
    client = _anthropic(searching.base_url)
    if helper:
        with client.messages.stream(**kwargs) as stream:
            for _text in stream.text_stream:
                break
    else:
        for event in client.messages.create(**kwargs, stream=True):
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                break
    assert searching.last.client_closed.wait(WAIT)
    reservation = only_reservation()
    line = charge_line(reservation)
    assert line.tool_calls == {"web_search": 1}  # the one search it showed, not the three held
    # The input message_start reported, and the started search's result at the guard's bound.
    assert line.input_tokens == 180 + SEARCH_CONTENT_TOKENS_PER_USE
    bill = from_anthropic(searching.final_usage(searching.last))
    assert line.cost >= _bill(reservation, bill)
    assert line.cost <= reservation.amount
    assert_conserved()


def test_an_async_search_stream_stopped_at_its_first_text_is_charged_the_search(
    searching: SearchingAnthropic,
) -> None:
    searching.then(chunks=200, delay=0.01)
    sdk = anthropic.AsyncAnthropic(base_url=searching.base_url, api_key="sk-test", max_retries=0)
    client = guarded_anthropic.guard(sdk, tenant="acme", end_user="u-1")
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}

    async def call() -> None:
        async with client.messages.stream(
            model=CLAUDE, max_tokens=1000, messages=MESSAGES, tools=[search]
        ) as stream:
            async for _text in stream.text_stream:
                break

    async_to_sync(call)()
    assert searching.last.client_closed.wait(WAIT)
    reservation = only_reservation()
    line = charge_line(reservation)
    assert line.tool_calls == {"web_search": 1}
    assert line.cost >= _bill(reservation, from_anthropic(searching.final_usage(searching.last)))
    assert_conserved()


def test_a_thinking_stream_stopped_early_is_charged_the_ceiling_however_thinking_was_asked(
    fake_anthropic: FakeAnthropic,
) -> None:
    """58x under before: thinking asked through ``extra_body`` streamed its summary, and only
    the summary was charged. The thinking block the stream shows is what tells."""
    fake_anthropic.then(chunks=200, delay=0.01)
    thinking = {"type": "enabled", "budget_tokens": 2000}
    stream = _anthropic(fake_anthropic.base_url).messages.create(
        model=CLAUDE,
        max_tokens=4000,
        messages=MESSAGES,
        stream=True,
        extra_body={"thinking": thinking},
    )
    for event in stream:
        if event.type == "content_block_delta":
            break
    assert fake_anthropic.last.client_closed.wait(WAIT)
    assert charge_line(only_reservation()).output_tokens == 4000
    assert_conserved()


class ToolStreamingOpenAI(FakeOpenAI):
    """A Responses stream that shows an output item (a web search call, or reasoning) before
    its text, as OpenAI streams one; the usage only in ``response.completed``."""

    first_item: dict[str, Any] = {}

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        if not seen.path.endswith("/responses"):
            yield from super().stream_events(seen, behaviour)
            return
        item = {"id": "item_1", **self.first_item}
        yield _sse(
            "response.output_item.added", {"output_index": 0, "item": item, "sequence_number": 0}
        )
        for n in range(behaviour.chunks):
            delta = {
                "item_id": "msg_fake",
                "output_index": 1,
                "content_index": 0,
                "delta": behaviour.text,
                "logprobs": [],
                "sequence_number": n + 1,
            }
            yield _sse("response.output_text.delta", delta)
        response = self._response(seen, behaviour.text * behaviour.chunks, self.responses_usage())
        yield _sse("response.completed", {"response": response, "sequence_number": n + 2})


@pytest.fixture
def tool_streaming() -> Iterator[ToolStreamingOpenAI]:
    seed_tenant(limit="100000000")
    server = ToolStreamingOpenAI()
    yield server
    server.stop()


def _stop_at_first_text(stream: Any) -> None:
    for event in stream:
        if event.type == "response.output_text.delta":
            break


def test_a_responses_stream_stopped_after_a_search_started_is_charged_its_fee(
    tool_streaming: ToolStreamingOpenAI,
) -> None:
    tool_streaming.first_item = {
        "type": "web_search_call",
        "status": "in_progress",
        "action": {"type": "search", "query": "news"},
    }
    tool_streaming.then(chunks=200, delay=0.01)
    _stop_at_first_text(
        _openai(tool_streaming.base_url).responses.create(
            model=GPT,
            input="What happened today?",
            tools=[{"type": "web_search"}],
            max_tool_calls=2,
            max_output_tokens=500,
            stream=True,
        )
    )
    assert tool_streaming.last.client_closed.wait(WAIT)
    reservation = only_reservation()
    line = charge_line(reservation)
    assert line.tool_calls == {"web_search": 1}
    # The held input (both allowed searches' results at the guard's bound), the fee.
    assert line.input_tokens == reservation.input_tokens
    bill = usage_validate(
        input_tokens=from_openai(tool_streaming.responses_usage()).input_tokens
        + SEARCH_CONTENT_TOKENS_PER_USE,
        output_tokens=12,
        tool_calls={"web_search": 1},
    )
    assert line.cost >= _bill(reservation, bill)
    assert_conserved()


def test_a_responses_stream_that_shows_reasoning_and_stops_is_charged_the_ceiling(
    tool_streaming: ToolStreamingOpenAI,
) -> None:
    """A model the guard takes for one that answers without reasoning (gpt-4o), whose stream
    shows a reasoning item: reasoning is billed as output it never streams."""
    tool_streaming.first_item = {"type": "reasoning", "summary": []}
    tool_streaming.then(chunks=200, delay=0.01)
    _stop_at_first_text(
        _openai(tool_streaming.base_url).responses.create(
            model=GPT, input="Think.", max_output_tokens=500, stream=True
        )
    )
    assert tool_streaming.last.client_closed.wait(WAIT)
    assert charge_line(only_reservation()).output_tokens == 500
    assert_conserved()


def test_a_stream_read_to_the_end_is_charged_the_providers_usage_not_the_worst_case(
    searching: SearchingAnthropic,
) -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    with _anthropic(searching.base_url).messages.stream(
        model=CLAUDE, max_tokens=1000, messages=MESSAGES, tools=[search]
    ) as stream:
        stream.get_final_message()
    reservation = only_reservation()
    line = charge_line(reservation)
    bill = from_anthropic(searching.final_usage(searching.last))
    assert (line.input_tokens, line.tool_calls) == (bill.input_tokens, {"web_search": 1})
    assert line.cost == _bill(reservation, bill)
    assert tenant_counter().reserved == 0
    assert_conserved()


# -- conservation and exactly-once under host transactions -------------------------------------


class ProviderCommitMachine(HostTransactionMachine):
    """The ledger machine (tests/test_ledger_machine.py) with the guards' commit among its
    moves: provider usage up to three times the hold's ceiling is recorded, never refused, and
    conservation and every hold's one terminal state still hold."""

    @rule(rid=HostTransactionMachine.holds, host=HOSTS, times=st.sampled_from([1, 3]))
    def provider_commit(self, rid: object, host: str, times: int) -> None:
        if self.expected.get(rid) != ReservationState.HELD:
            return
        ceiling = Reservation.objects.get(pk=rid).max_output_tokens
        usage = usage_validate(input_tokens=0, output_tokens=ceiling * times)

        def commit() -> object:
            result = settlement.reservation_commit_provider_usage(rid, usage=usage)
            assert result.state == ReservationState.COMMITTED
            assert result.overage == result.cost - result.reserved  # the hold priced 1x
            return result

        in_host(host, commit)
        if self._stands(host):
            self.expected[rid] = ReservationState.COMMITTED


@pytest.mark.django_db(transaction=True)
def test_provider_commits_keep_conservation_and_exactly_once_under_host_transactions() -> None:
    price_fake()
    run_state_machine_as_test(
        ProviderCommitMachine,
        settings=settings(max_examples=8, stateful_step_count=20, deadline=None, database=None),
    )
