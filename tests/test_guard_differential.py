"""The differential harness: every call of the corpus (tests/guard_corpus.py) through the real
``openai`` / ``anthropic`` client wrapped by ``guard()``, against a fake provider that bills it by
the published rules (llm_budgets/testing/fakes/bills.py, which imports nothing from the app).
After settlement and the expiry sweep: held >= bill, charged == bill (>= where the caller cut the
stream), and an ordinary call is never refused. The ledger is priced with the calculator's own
rates, so what is compared is the rules (which tokens, at which tier, which fees), not the rate
table: a wrong figure there is caught by tests/test_fake_bills.py.

A case that fails on main today is listed in ``PENDING`` with why: it is a strict xfail, so the
change that fixes it fails this test until its entry is removed.

``LLMB_WRITE_GUARD_TABLE=1`` rewrites docs/integrations.md's tables (the per-case rows and the
parameter classification) when the whole corpus ran: ``make guard-table``.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetError
from llm_budgets.integrations import anthropic as guarded_anthropic
from llm_budgets.integrations import openai as guarded_openai
from llm_budgets.models import Reservation, UsageRecord
from llm_budgets.money import QUANTUM
from llm_budgets.testing.fakes import bills
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT, FakeProvider
from tests import guard_tables
from tests.factories import PRICES_START
from tests.guard_corpus import CASES, Case
from tests.integrations import attribute_at

pytestmark = pytest.mark.django_db

# Cases that fail on main, each with what goes wrong: remove an entry when the change that fixes
# it lands (the strict xfail then fails until it is removed). Empty since issue #39 landed; the
# 34 entries it started with are in its history.
PENDING: dict[str, str] = {}

# Over-charges the guard makes on purpose, each with why (never an under-charge: where the rates
# are unknown, the guard charges the documented upper bound rather than refuse the call).
OVER_CHARGED: dict[str, str] = {
    "oai_priority_catalogue_price": "a price without priority rates is held and charged at "
    "SERVICE_TIER_MULTIPLIERS' upper bound (2x); gpt-4o's priority rates are 1.7x",
}


# -- prices: the ledger gets the bill calculator's own rate table --------------------------------


def _rates(rates: bills.Rates) -> dict[str, str]:
    names = {
        "input_per_mtok": rates.input,
        "cached_input_per_mtok": rates.cached_input,
        "cache_write_per_mtok": rates.cache_write,
        "cache_write_1h_per_mtok": rates.cache_write_1h,
        "output_per_mtok": rates.output,
    }
    return {name: str(value) for name, value in names.items() if value is not None}


def set_prices(mode: str) -> None:
    """Every model of the rate table at its standard rates, its long-context tier, its server
    tools' fees, and (``mode == "tiers"``) its premium tiers and fast mode listed; the
    ``"catalogue"`` mode lists no tier, as the catalogue import brings none."""
    for provider, models in bills.RATES.items():
        fees = {name: str(fee) for name, fee in bills.FEES[provider].items() if fee}
        for model, table in models.items():
            if "search-preview" in model:  # a chat search model's price lists its own fee
                fees_of_model = {**fees, "web_search": fees["web_search_preview_chat"]}
            else:
                fees_of_model = fees
            standard = table["standard"]
            service_tiers = {}
            if mode == "tiers":
                service_tiers = {t: _rates(r) for t, r in table.items() if t != "standard"}
                if provider == "anthropic":
                    service_tiers["fast"] = _rates(
                        standard.times(bills.MULTIPLIERS["anthropic"]["fast"])
                    )
            long = bills.LONG_CONTEXT.get(model)
            fields = _rates(standard)
            budgets.set_price(
                provider=provider,
                model=model,
                input_per_mtok=fields.pop("input_per_mtok"),
                output_per_mtok=fields.pop("output_per_mtok"),
                tool_fees=fees_of_model,
                service_tiers=service_tiers,
                tiers=[{"above_input_tokens": long[0], "prices": _rates(long[1])}] if long else [],
                context_window=bills.CONTEXT_WINDOW.get(model),
                max_output_tokens=bills.MAX_OUTPUT.get(model),
                effective_from=PRICES_START,
                **fields,
            )


# -- running a case ------------------------------------------------------------------------------


@dataclass
class Row:
    """One case's outcome: what the guard held and charged against what the provider billed."""

    case: Case
    refused: str = ""
    held: Decimal = Decimal(0)
    bill: Decimal = Decimal(0)
    charged: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)  # still counted after the sweep (held or uncertain holds)

    @property
    def cut(self) -> bool:
        return self.case.stop_after is not None

    def problems(self) -> list[str]:
        if self.refused:
            return ["false refusal"] if self.case.ordinary else []
        found = []
        if self.held < self.bill:
            found.append("under-held")
        if self.charged < self.bill:
            found.append("under-charged")
        elif self.charged > self.bill and not self.cut and self.case.name not in OVER_CHARGED:
            found.append("over-charged")
        return found


ROWS: dict[str, Row] = {}


def _is_text(event: Any) -> bool:
    """Whether a stream event (any SDK, raw or helper) carries visible text."""
    kind = getattr(event, "type", None)
    if kind in {"response.output_text.delta", "content.delta"}:
        return True
    if kind == "content_block_delta":
        return getattr(event.delta, "type", "") == "text_delta"
    choices = getattr(event, "choices", None) or []
    return any(getattr(choice.delta, "content", None) for choice in choices)


def _consume(stream: Any, stop_after: int | None) -> None:
    texts = 0
    for event in stream:
        texts += _is_text(event)
        if stop_after is not None and texts >= stop_after:
            break


async def _aconsume(stream: Any, stop_after: int | None) -> None:
    texts = 0
    async for event in stream:
        texts += _is_text(event)
        if stop_after is not None and texts >= stop_after:
            break


def _call(client: Any, case: Case, kwargs: dict[str, Any]) -> Any:
    method = attribute_at(client, case.call)
    if not case.stream:
        return method(**kwargs)
    if case.helper:
        with method(**kwargs) as stream:
            _consume(stream, case.stop_after)
        return None
    stream = method(**kwargs)
    _consume(stream, case.stop_after)
    stream.close()
    return None


async def _acall(client: Any, case: Case, kwargs: dict[str, Any]) -> Any:
    method = attribute_at(client, case.call)
    if not case.stream:
        return await method(**kwargs)
    if case.helper:
        async with method(**kwargs) as stream:
            await _aconsume(stream, case.stop_after)
        return None
    stream = await method(**kwargs)
    await _aconsume(stream, case.stop_after)
    await stream.close()
    return None


def _client(case: Case, fake: FakeProvider) -> Any:
    asynchronous = case.asynchronous
    if case.sdk == "openai":
        klass: Any = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        sdk = klass(base_url=f"{fake.base_url}/v1", api_key="sk-test", max_retries=0, timeout=WAIT)
        return guarded_openai.guard(sdk, tenant="acme", end_user="u-1")
    klass = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    sdk = klass(base_url=fake.base_url, api_key="sk-test", max_retries=0, timeout=WAIT)
    return guarded_anthropic.guard(sdk, tenant="acme", end_user="u-1")


def run(case: Case) -> Row:
    """The case through the guarded client, then the sweep; the ledger against the fake's bill."""
    set_prices(case.prices)
    budgets.ensure_tenant(tenant="acme", name="Acme")
    budgets.set_limit(tenant="acme", amount=Decimal(100000), window="month")
    fake: FakeOpenAI | FakeAnthropic = (
        FakeOpenAI(realistic=True) if case.sdk == "openai" else FakeAnthropic(realistic=True)
    )
    try:
        return _run(case, fake)
    finally:
        fake.stop()


def _run(case: Case, fake: FakeOpenAI | FakeAnthropic) -> Row:
    for name, value in case.fake.items():
        setattr(fake, name, value)
    client = _client(case, fake)
    kwargs = dict(case.kwargs)
    if case.chain is not None:  # an earlier turn through the same guarded client
        fake.then()
        first = (
            async_to_sync(_acall)(client, _plain(case), case.chain)
            if case.asynchronous
            else _call(client, _plain(case), case.chain)
        )
        if case.chain_via_extra_body:
            kwargs["extra_body"] = {"previous_response_id": first.id}
        else:
            kwargs["previous_response_id"] = first.id
    if case.warm:  # the same call once, read to its end, before the one measured
        fake.then()
        warm = Case(case.name, case.sdk, case.call, {}, stream=case.stream, helper=case.helper)
        _call(client, warm, kwargs)
    before_requests = len(fake.requests)
    before = set(Reservation.objects.values_list("id", flat=True))
    fake.then(
        **({"text": case.text, "chunks": 1} if case.text else {}), cut_after_text=case.stop_after
    )
    row = Row(case)
    try:
        if case.asynchronous:
            async_to_sync(_acall)(client, case, kwargs)
        else:
            _call(client, case, kwargs)
    except Exception as exc:
        refusal = _refusal(exc)
        if refusal is None:
            raise
        row.refused = f"{type(refusal).__name__}: {refusal}"
        assert len(fake.requests) == before_requests, "a refused call sent nothing"
    for seen in fake.requests[before_requests:]:
        assert seen.finished.wait(WAIT), "the fake finished the request"
    budgets.sweep(now=timezone.now() + timedelta(days=1))
    mine = Reservation.objects.exclude(id__in=before)
    row.held = sum((r.amount for r in mine), Decimal(0))
    row.charged = sum(
        (line.cost for line in UsageRecord.objects.filter(reservation__in=mine)), Decimal(0)
    )
    row.reserved = sum((r.amount for r in mine if r.state in {"held", "uncertain"}), Decimal(0))
    billed = sum((seen.bill.total for seen in fake.requests[before_requests:]), Decimal(0))
    row.bill = billed.quantize(QUANTUM, rounding=ROUND_HALF_EVEN)
    return row


def _refusal(exc: BaseException) -> BudgetError | None:
    """The guard's refusal behind ``exc``: itself, or the cause an SDK wrapped it in (a refusal
    raised inside the client's HTTP transport reaches the caller as the SDK's own error)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BudgetError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _plain(case: Case) -> Case:
    """The chain's first turn: the same client path, not streamed."""
    return Case(case.name, case.sdk, "responses.create", {}, asynchronous=case.asynchronous)


def _params() -> Iterator[Any]:
    for case in CASES:
        marks = []
        if case.name in PENDING:
            # Only the harness's own verdict is expected to fail: any other error is a failure.
            marks.append(
                pytest.mark.xfail(strict=True, raises=AssertionError, reason=PENDING[case.name])
            )
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_the_guard_holds_and_charges_what_the_provider_bills(case: Case) -> None:
    row = run(case)
    ROWS[case.name] = row
    assert not row.problems(), (
        f"{case.name}: {', '.join(row.problems())} (held {row.held}, bill {row.bill}, "
        f"charged {row.charged}{', refused: ' + row.refused if row.refused else ''})"
    )


def test_pending_names_real_cases() -> None:
    assert set(PENDING) | set(OVER_CHARGED) <= {case.name for case in CASES}


def test_the_issue_findings_are_all_in_the_corpus() -> None:
    """Issue #39's 15 under-charges (one of them also streamed) and 14 false refusals."""
    issues = [case.issue for case in CASES]
    assert issues.count("under-charge") == 16
    assert issues.count("false refusal") == 14
    assert sum(not case.issue for case in CASES) >= 20


def test_the_bill_calculator_imports_nothing_from_the_app() -> None:
    """The second opinion is independent: bills.py imports no llm_budgets module."""
    tree = ast.parse(Path(bills.__file__).read_text())
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported, "the check sees the imports"
    assert not [name for name in imported if name.split(".")[0] == "llm_budgets"]


@pytest.fixture(scope="module", autouse=True)
def _write_table() -> Iterator[None]:
    yield
    if os.environ.get("LLMB_WRITE_GUARD_TABLE") and len(ROWS) == len(CASES):
        guard_tables.write([ROWS[case.name] for case in CASES], pending=PENDING)
