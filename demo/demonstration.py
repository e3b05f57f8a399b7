"""The demonstration behind ``make demo`` and the sample data the demo admin shows.

``demo_run`` sends the same calls through a naive check-then-call counter and through
``llm_budgets``, with real threads and a fake provider that takes 5 ms per call (a simulated network
round trip). Every number it reports is counted from what happened, never written down in advance.

``demo_data_load`` fills an installation with prices, a plan, tenants, budgets and reservations
through the public API, idempotently. Neither is imported by the rest of the app.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.db.models import Model
from django.utils import timezone

from demo.usage_month import DAYS, demo_month_load, page_users_ensure
from llm_budgets import budgets
from llm_budgets.exceptions import BudgetError, BudgetExceeded, UnknownPrice
from llm_budgets.models import (
    AuditEvent,
    Budget,
    Counter,
    EndUser,
    Plan,
    Price,
    Reservation,
    Scope,
    Tenant,
    UsageRecord,
)
from llm_budgets.money import ZERO, display
from llm_budgets.pricing.prices import actual_cost, price_in_effect, worst_case
from llm_budgets.results import BudgetStatus
from llm_budgets.tenancy.tenants import tenant_ensure

T = TypeVar("T")

# The scenario of issue 2: limit 100, worst case 30, 10 calls at once, 4 calls that fail.
LIMIT = Decimal(100)
CONCURRENT_CALLS = 10
FAILING_CALLS = 4
# A simulated provider round trip. It only widens the naive code's gap between check and add;
# nothing is inferred from timing.
PROVIDER_LATENCY_SECONDS = 0.005
DEMO_PROVIDER = "demo"
DEMO_MODEL = "fake-5ms"
# 1,000 output tokens at 30,000 per million: each call's worst case is exactly 30.
OUTPUT_CEILING = 1000
DEMO_OUTPUT_PER_MTOK = Decimal(30000)

ADMITTED = "admitted"
FAILED = "failed"  # admitted, then the provider call raised
REFUSED = "refused"
ERROR = "error"


class ProviderError(Exception):
    """The fake provider's outage (think HTTP 503): the call produced nothing."""


class FakeProvider:
    """Answers after a simulated round trip, using every output token it may (so each call costs
    exactly its worst case), and keeps the bill the operator would pay."""

    def __init__(self, price: Price) -> None:
        self._price = price
        self._lock = threading.Lock()
        self.billed = ZERO

    def call(self, *, max_output_tokens: int, fail: bool = False) -> dict[str, int]:
        time.sleep(PROVIDER_LATENCY_SECONDS)
        if fail:
            raise ProviderError("fake provider: 503 Service Unavailable")
        usage = {"input_tokens": 0, "output_tokens": max_output_tokens}
        with self._lock:
            self.billed += actual_cost(
                self._price,
                input_tokens=usage["input_tokens"],
                output_tokens=usage["output_tokens"],
            )
        return usage


class NaiveCounter:
    """The usual first attempt: a running total, checked before the call.

    The add is atomic (as ``UPDATE ... SET spent = spent + cost`` would be); the check is not tied
    to it and nothing is held while the call runs, which is the whole problem.
    """

    def __init__(self, limit: Decimal) -> None:
        self.limit = limit
        self.spent = ZERO
        self._lock = threading.Lock()

    def allows(self) -> bool:
        return self.spent < self.limit

    def add(self, amount: Decimal) -> None:
        with self._lock:
            self.spent += amount


@dataclass(frozen=True)
class Outcome:
    kind: str  # ADMITTED, FAILED, REFUSED or ERROR
    held: Decimal = ZERO  # the hold llm_budgets took before calling
    message: str = ""


def naive_call_then_add(counter: NaiveCounter, provider: FakeProvider, price: Price) -> Outcome:
    """Naive A, post-paid: check the total, call, add the cost."""
    if not counter.allows():
        return Outcome(REFUSED)
    usage = provider.call(max_output_tokens=OUTPUT_CEILING)
    counter.add(
        actual_cost(price, input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])
    )
    return Outcome(ADMITTED)


def naive_charge_then_call(
    counter: NaiveCounter, provider: FakeProvider, estimate: Decimal
) -> Outcome:
    """Naive B, pre-paid: check the total, charge the estimate, call. Nothing refunds a failure."""
    if not counter.allows():
        return Outcome(REFUSED)
    counter.add(estimate)
    try:
        provider.call(max_output_tokens=OUTPUT_CEILING, fail=True)
    except ProviderError:
        return Outcome(FAILED)
    return Outcome(ADMITTED)


def guarded_call(
    tenant: str, provider: FakeProvider, *, fail: bool = False, run: str | None = None
) -> Outcome:
    """The same call through llm_budgets: hold the worst case, call, commit; an exception inside
    the with-block releases the hold."""
    held = ZERO
    try:
        with budgets.reserve(
            tenant=tenant,
            run=run,
            provider=DEMO_PROVIDER,
            model=DEMO_MODEL,
            input_tokens=0,
            max_output_tokens=OUTPUT_CEILING,
        ) as hold:
            held = hold.amount
            usage = provider.call(max_output_tokens=hold.max_output_tokens, fail=fail)
            hold.commit(input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])
    except BudgetExceeded as exc:
        return Outcome(REFUSED, message=str(exc))
    except ProviderError:
        return Outcome(FAILED, held=held)
    except BudgetError as exc:  # e.g. LedgerUnavailable: reported as a problem, not hidden
        return Outcome(ERROR, message=f"{type(exc).__name__}: {exc}")
    return Outcome(ADMITTED, held=held)


def run_together(count: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` in ``count`` threads released at the same instant by a barrier, each on its
    own database connection."""
    barrier = threading.Barrier(count)

    def task(index: int) -> T:
        try:
            barrier.wait(timeout=30)
            return work(index)
        finally:
            connections.close_all()  # this thread's connections only

    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(task, i) for i in range(count)]
        return [future.result() for future in futures]


@dataclass(frozen=True)
class Side:
    """One column of the table: what one implementation let happen."""

    admitted: int
    refused: int
    reserved: Decimal | None  # held before calling; None: the naive code holds nothing
    billed: Decimal  # what the provider charged the operator
    spent: Decimal  # what the budget counts as spent
    remaining: Decimal


@dataclass(frozen=True)
class Scenario:
    calls: int
    naive_code: str
    naive: Side
    guarded: Side


@dataclass(frozen=True)
class DemoReport:
    database: str
    currency: str
    limit: Decimal
    worst_case: Decimal
    latency_ms: int
    race: Scenario
    failures: Scenario
    runs: list[str]
    refusal_example: str
    problems: list[str] = field(default_factory=list)


def _counts(outcomes: list[Outcome]) -> dict[str, int]:
    return {
        "admitted": sum(o.kind in (ADMITTED, FAILED) for o in outcomes),
        "refused": sum(o.kind == REFUSED for o in outcomes),
    }


def _naive_side(price: Price, calls: Callable[[NaiveCounter, FakeProvider], list[Outcome]]) -> Side:
    counter, provider = NaiveCounter(LIMIT), FakeProvider(price)
    outcomes = calls(counter, provider)
    return Side(
        **_counts(outcomes),
        reserved=None,
        billed=provider.billed,
        spent=counter.spent,
        remaining=max(ZERO, LIMIT - counter.spent),
    )


@dataclass(frozen=True)
class _Guarded:
    side: Side
    status: BudgetStatus  # the run's budget after every call has settled
    outcomes: list[Outcome]


def _guarded_side(
    price: Price, target: _Target, calls: Callable[[FakeProvider], list[Outcome]]
) -> _Guarded:
    provider = FakeProvider(price)
    outcomes = calls(provider)
    statuses = budgets.status(tenant=target.tenant, run=target.run)
    status = next(s for s in statuses if s.scope == Scope.RUN and target.run in s.scope_label)
    side = Side(
        **_counts(outcomes),
        reserved=sum((o.held for o in outcomes), ZERO),
        billed=provider.billed,
        spent=status.spent,
        remaining=status.remaining,
    )
    return _Guarded(side, status, outcomes)


def _price_ensure(
    provider: str,
    model: str,
    *,
    replace_different: bool = False,
    effective_from: datetime | None = None,
    **rates: Decimal | None,
) -> Price:
    """The price in effect; a new version only when none is (or, if asked, when it differs).
    ``rates``: the per-million-token prices of ``budgets.set_price``."""
    try:
        price = price_in_effect(provider=provider, model=model, at=timezone.now())
    except UnknownPrice:
        pass
    else:
        current = {name: getattr(price, name) for name in rates}
        if not replace_different or (current == rates and price.per_request == 0):
            return price
    added = budgets.set_price(
        provider=provider,
        model=model,
        effective_from=effective_from,
        **rates,  # type: ignore[arg-type]
    )
    return Price.objects.get(pk=added.id)


@dataclass(frozen=True)
class _Target:
    """Where one scenario's calls go: the demo's own tenant, and this run of the demo."""

    tenant: str
    run: str

    def __str__(self) -> str:
        return f"{self.tenant} run {self.run}"


def _demo_target(label: str, run_id: str) -> _Target:
    """A fresh run budget per demo run, on one tenant per scenario, so the demo re-runs on any
    database, touches nobody else's budgets, and leaves no new tenant behind each time."""
    external_id = f"demo-{label}"
    budgets.ensure_tenant(tenant=external_id, name=f"Demo ({label})")
    # Lifetime, so a run that straddles midnight or a month boundary still adds up.
    budgets.set_limit(
        tenant=external_id, run=run_id, amount=LIMIT, window="lifetime", actor=DEMO_ACTOR
    )
    return _Target(external_id, run_id)


def _race_problems(race: _Guarded, tenant: _Target) -> list[str]:
    """Invariant 1 (no overspend by admission) and conservation, for the race tenant."""
    problems = [o.message for o in race.outcomes if o.kind == ERROR]
    held, status = race.side.reserved or ZERO, race.status
    if held > LIMIT:
        problems.append(
            f"llm_budgets held {display(held)} at once against a limit of {display(LIMIT)}."
        )
    if status.spent + status.reserved > LIMIT:
        problems.append(
            f"llm_budgets let {tenant} use {display(status.spent + status.reserved)} of "
            f"{display(LIMIT)}."
        )
    if status.spent != race.side.billed or status.reserved != ZERO:
        problems.append(
            f"The ledger says spent {display(status.spent)}, reserved {display(status.reserved)}; "
            f"the provider billed {display(race.side.billed)} and every call was settled."
        )
    return problems


def _failure_problems(failures: _Guarded, tenant: _Target) -> list[str]:
    """A failed call must leave nothing behind."""
    problems = [o.message for o in failures.outcomes if o.kind == ERROR]
    status = failures.status
    if status.spent != ZERO or status.reserved != ZERO:
        problems.append(
            f"Failed calls left spent {display(status.spent)} and reserved "
            f"{display(status.reserved)} on {tenant}; their holds should have been released."
        )
    return problems


def demo_run() -> DemoReport:
    """Run both scenarios through both implementations and check llm_budgets' guarantees."""
    price = _price_ensure(
        DEMO_PROVIDER,
        DEMO_MODEL,
        replace_different=True,
        input_per_mtok=ZERO,
        output_per_mtok=DEMO_OUTPUT_PER_MTOK,
        cached_input_per_mtok=None,
        cache_write_per_mtok=None,
    )
    estimate = worst_case(price, input_tokens=0, max_output_tokens=OUTPUT_CEILING)
    run_id = f"{datetime.now(tz=UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    race_tenant = _demo_target("race", run_id)
    failure_tenant = _demo_target("failures", run_id)

    # A. Every call started at the same instant.
    naive_race = _naive_side(
        price,
        lambda counter, provider: run_together(
            CONCURRENT_CALLS, lambda _: naive_call_then_add(counter, provider, price)
        ),
    )
    race = _guarded_side(
        price,
        race_tenant,
        lambda provider: run_together(
            CONCURRENT_CALLS,
            lambda _: guarded_call(race_tenant.tenant, provider, run=race_tenant.run),
        ),
    )
    # B. Calls whose provider call fails, one after another.
    naive_failures = _naive_side(
        price,
        lambda counter, provider: [
            naive_charge_then_call(counter, provider, estimate) for _ in range(FAILING_CALLS)
        ],
    )
    failures = _guarded_side(
        price,
        failure_tenant,
        lambda provider: [
            guarded_call(failure_tenant.tenant, provider, fail=True, run=failure_tenant.run)
            for _ in range(FAILING_CALLS)
        ],
    )
    refusals = [o.message for o in race.outcomes if o.kind == REFUSED]
    return DemoReport(
        database=connection.vendor,
        currency=price.currency,
        limit=LIMIT,
        worst_case=estimate,
        latency_ms=round(PROVIDER_LATENCY_SECONDS * 1000),
        race=Scenario(
            calls=CONCURRENT_CALLS,
            naive_code="if spent < limit: usage = call(); spent += cost(usage)",
            naive=naive_race,
            guarded=race.side,
        ),
        failures=Scenario(
            calls=FAILING_CALLS,
            naive_code="if spent < limit: spent += estimate; call()   # no refund if it raises",
            naive=naive_failures,
            guarded=failures.side,
        ),
        runs=[str(race_tenant), str(failure_tenant)],
        refusal_example=refusals[0] if refusals else "",
        problems=_race_problems(race, race_tenant) + _failure_problems(failures, failure_tenant),
    )


def render(report: DemoReport) -> str:
    """The table a newcomer reads in ten seconds, then why."""
    race, fail = report.race, report.failures

    def money(value: Decimal | None) -> str:
        return "nothing" if value is None else display(value)

    def over(side: Side) -> str:
        return display(max(ZERO, side.spent - report.limit))

    def row(label: str, scenario: Scenario, value: Callable[[Side], str]) -> tuple[str, ...]:
        return (f"   {label}", value(scenario.naive), value(scenario.guarded))

    def counts(side: Side) -> str:
        return f"{side.admitted} / {side.refused}"

    rows: list[tuple[str, ...]] = [
        ("", "naive counter", "llm_budgets"),
        (f"A. {race.calls} calls started together", "", ""),
        row("admitted / refused", race, counts),
        row("held before calling", race, lambda side: money(side.reserved)),
        row("spent (the provider's bill)", race, lambda side: money(side.billed)),
        row("over the limit by", race, over),
        (f"B. {fail.calls} calls whose provider call fails", "", ""),
        row("admitted / refused", fail, counts),
        row("the provider's bill", fail, lambda side: money(side.billed)),
        row("counted as spent", fail, lambda side: money(side.spent)),
        row("left to spend", fail, lambda side: money(side.remaining)),
    ]
    width = max(len(r[0]) for r in rows) + 2
    table = [f"{a:<{width}}{b:<18}{c}".rstrip() for a, b, c in rows]
    lines = [
        f"llm_budgets demo: a limit of {display(report.limit)} {report.currency}, each "
        f"call's worst case {display(report.worst_case)},",
        f"a fake provider that answers in {report.latency_ms} ms, real threads, "
        f"database {report.database}. Every number below is counted.",
        "",
        *table,
        "",
        f"naive A:     {race.naive_code}",
        f"naive B:     {fail.naive_code}",
        "llm_budgets: with budgets.reserve(...) as hold: usage = call(); hold.commit(**usage)",
        "",
        textwrap.fill(
            f"Why: in A the naive check and its add are a provider call apart, so "
            f"{race.naive.admitted} of {race.calls} threads passed the check before the total "
            "caught up; llm_budgets holds each call's worst case in the same locked transaction "
            f"that checks the limit, so once {money(race.guarded.reserved)} was held the other "
            f"{race.guarded.refused} calls were refused. In B the naive code charged up front "
            "and never refunded; llm_budgets released each failed call's hold when the "
            "exception left the with-block.",
            100,
        ),
    ]
    if report.refusal_example:
        lines += ["", textwrap.fill(f"A refused call is told why: {report.refusal_example}", 100)]
    return "\n".join(lines)


# --- demo data --------------------------------------------------------------------------------

# Public list prices in USD per million tokens: input, output, cached input (read), cache write.
DEMO_PRICES: list[tuple[str, str, str, str, str, str | None]] = [
    ("openai", "gpt-4o", "2.50", "10.00", "1.25", None),
    ("openai", "gpt-4o-mini", "0.15", "0.60", "0.075", None),
    ("anthropic", "claude-sonnet-4-20250514", "3.00", "15.00", "0.30", "3.75"),
    ("anthropic", "claude-3-5-haiku-20241022", "0.80", "4.00", "0.08", "1.00"),
]
DEMO_PRICES_FROM = datetime(2024, 1, 1, tzinfo=UTC)
DEMO_PLAN = "Starter (demo)"
# Who the audit log says made the demo's changes.
DEMO_DATA_ACTOR = "demo data"
# external id, name, timezone, billing day
DEMO_TENANTS = [
    ("acme", "Acme Corp", "Europe/Amsterdam", 1),
    ("globex", "Globex", "America/New_York", 15),
    ("initech", "Initech", "Asia/Tokyo", 28),
]
# tenant (None: global), end user ("*": each end user), window, limit
DEMO_LIMITS: list[tuple[str | None, str | None, str, str]] = [
    (None, None, "month", "10000"),
    ("acme", None, "month", "50"),
    ("acme", "*", "day", "2"),
    ("acme", "alice", "month", "10"),
    ("globex", None, "month", "200"),
    ("globex", "*", "day", "5"),
    ("initech", None, "month", "20"),
    ("initech", "*", "hour", "1"),
]


@dataclass(frozen=True)
class DemoCall:
    """A reservation of the demo data: reserved, then committed, released or left open."""

    key: str
    tenant: str
    end_user: str
    provider: str
    model: str
    input_tokens: int
    max_output_tokens: int
    settle: str  # "commit", "release" or "open"
    output_tokens: int = 0
    cached_input_tokens: int = 0


DEMO_CALLS = [
    DemoCall("demo-1", "acme", "alice", "openai", "gpt-4o", 90_000, 4_000, "commit", 2_300, 40_000),
    DemoCall("demo-2", "acme", "bob", "openai", "gpt-4o-mini", 120_000, 8_000, "commit", 5_100),
    DemoCall(
        "demo-3", "acme", "carol", "anthropic", "claude-sonnet-4-20250514", 60_000, 4_000, "release"
    ),
    DemoCall(
        "demo-4", "acme", "alice", "anthropic", "claude-sonnet-4-20250514", 80_000, 2_000, "open"
    ),
    DemoCall("demo-5", "globex", "g-1001", "openai", "gpt-4o", 110_000, 16_000, "commit", 9_800),
    DemoCall(
        "demo-6",
        "globex",
        "g-1002",
        "anthropic",
        "claude-3-5-haiku-20241022",
        150_000,
        8_000,
        "open",
    ),
    DemoCall("demo-7", "initech", "i-1", "openai", "gpt-4o-mini", 40_000, 2_000, "release"),
    DemoCall(
        "demo-8",
        "initech",
        "i-2",
        "anthropic",
        "claude-sonnet-4-20250514",
        150_000,
        6_000,
        "commit",
        4_200,
        100_000,
    ),
]
# Open demo holds live as long as a hold may, so the admin shows them for a day.
OPEN_HOLD_TTL_SECONDS = 24 * 60 * 60
ADMIN_USERNAME = "admin"
DEMO_ACTOR = "demo (race run)"
ADMIN_URL = "http://127.0.0.1:8000/admin/"
USAGE_URL = "http://127.0.0.1:8000/usage/"


@dataclass(frozen=True)
class DemoData:
    created: dict[str, int]  # rows this run added, per table
    reservations: dict[str, int]  # demo reservations by state
    admin_username: str
    admin_password: str | None  # None: no admin account was touched
    month: dict[str, int] = field(default_factory=dict)  # the month of usage: calls by outcome
    page_users: list[str] = field(default_factory=list)  # logins for the tenant usage pages


def _plan_ensure(name: str, *, default_max_output_tokens: int) -> Plan:
    # Plans are configuration, not ledger state; no service owns them yet.
    plan, _ = Plan.objects.get_or_create(
        name=name, defaults={"default_max_output_tokens": default_max_output_tokens}
    )
    return plan


def _admin_ensure(username: str, password: str | None) -> str:
    """A superuser with a fresh password on every run: nothing secret lives in the repository."""
    user_model = get_user_model()
    lookup: dict[str, Any] = {user_model.USERNAME_FIELD: username}
    user, _ = user_model._default_manager.get_or_create(**lookup)
    password = password or secrets.token_urlsafe(12)
    user.is_staff = True
    user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


def _row_counts() -> dict[str, int]:
    tables: list[type[Model]] = [
        Price,
        Plan,
        Tenant,
        EndUser,
        Budget,
        Counter,
        Reservation,
        UsageRecord,
        AuditEvent,
        get_user_model(),
    ]
    return {model._meta.label: model._default_manager.count() for model in tables}


def demo_data_load(
    *, admin: bool = True, admin_password: str | None = None, month: bool = True
) -> DemoData:
    """Prices, a plan, tenants, budgets and reservations, through the public API. Idempotent:
    reservations carry idempotency keys, so a second run finds them instead of adding more.
    ``month``: also a month of usage for the tenant pages (``demo.usage_month``)."""
    before = _row_counts()
    for provider, model, input_price, output_price, cached, cache_write in DEMO_PRICES:
        _price_ensure(
            provider,
            model,
            input_per_mtok=Decimal(input_price),
            output_per_mtok=Decimal(output_price),
            cached_input_per_mtok=Decimal(cached),
            cache_write_per_mtok=None if cache_write is None else Decimal(cache_write),
            # In effect long before the month of usage the tenant pages show.
            effective_from=DEMO_PRICES_FROM,
        )
    plan = _plan_ensure(DEMO_PLAN, default_max_output_tokens=1024)
    for external_id, name, tz, billing_day in DEMO_TENANTS:
        tenant_ensure(
            external_id,
            name=name,
            timezone=tz,
            billing_day=billing_day,
            plan=plan.name,
            actor=DEMO_DATA_ACTOR,
        )
    for tenant, end_user, window, amount in DEMO_LIMITS:
        budgets.set_limit(
            tenant=tenant,
            end_user=end_user,
            window=window,
            amount=Decimal(amount),
            actor=DEMO_DATA_ACTOR,
        )
    states: dict[str, int] = {}
    for call in DEMO_CALLS:
        hold = budgets.reserve(
            tenant=call.tenant,
            end_user=call.end_user,
            provider=call.provider,
            model=call.model,
            input_tokens=call.input_tokens,
            max_output_tokens=call.max_output_tokens,
            idempotency_key=call.key,
            ttl=OPEN_HOLD_TTL_SECONDS if call.settle == "open" else None,
        )
        # Settling again is a no-op that reports the first outcome.
        if call.settle == "commit":
            hold.commit(
                input_tokens=call.input_tokens,
                output_tokens=call.output_tokens,
                cached_input_tokens=call.cached_input_tokens,
            )
        elif call.settle == "release":
            hold.release()
        states[hold.state] = states.get(hold.state, 0) + 1
    month_calls = demo_month_load() if month else {}
    password = _admin_ensure(ADMIN_USERNAME, admin_password) if admin else None
    page_users = page_users_ensure(password) if password is not None else []
    after = _row_counts()
    return DemoData(
        created={label: after[label] - before[label] for label in after},
        reservations=states,
        admin_username=ADMIN_USERNAME,
        admin_password=password,
        month=month_calls,
        page_users=page_users,
    )


def _limits_text(tenant: str | None) -> str:
    parts = []
    for owner, end_user, window, amount in DEMO_LIMITS:
        if owner != tenant:
            continue
        who = "" if end_user is None else " each end user" if end_user == "*" else f" {end_user}"
        parts.append(f"{display(Decimal(amount))}/{window}{who}")
    return ", ".join(parts)


def render_data(data: DemoData) -> str:
    """A short summary of what the demo data holds and what this run added."""
    created = {label.rsplit(".", 1)[1]: n for label, n in data.created.items() if n}
    providers: dict[str, list[str]] = {}
    for provider, model, *_ in DEMO_PRICES:
        providers.setdefault(provider, []).append(model)
    states = ", ".join(f"{n} {state}" for state, n in sorted(data.reservations.items()))
    lines = [
        "Demo data loaded (run it again any time: it adds only what is missing).",
        "  prices        " + "; ".join(f"{p} {', '.join(m)}" for p, m in providers.items()),
        f"  plan          {DEMO_PLAN}",
        f"  global        {_limits_text(None)}",
        *(
            f"  {tenant:<13} {tz}, billing day {day}: {_limits_text(tenant)}"
            for tenant, _, tz, day in DEMO_TENANTS
        ),
        f"  reservations  {states} (held ones stay open until swept)",
        f"  usage month   {data.month.get('committed', 0)} calls over {DAYS} days "
        "through the services (the usage pages' charts)",
        "  added now     "
        + (", ".join(f"{n} {label}" for label, n in created.items()) or "nothing, all present"),
    ]
    if data.admin_password is not None:
        lines += [
            "",
            f"Admin: {ADMIN_URL}  user {data.admin_username!r}  password {data.admin_password!r}",
            f"Usage pages: {USAGE_URL}  users "
            + ", ".join(repr(name) for name in data.page_users)
            + " (same password; alice is a member and sees only her own usage)",
            "(a new random password on every run of this command; none is kept in the repo)",
        ]
    return "\n".join(lines)


def as_json(value: Any) -> str:
    """A report or summary as JSON (amounts as strings), for scripts and tests."""
    return json.dumps(
        asdict(value),
        default=lambda v: display(v) if isinstance(v, Decimal) else str(v),
        indent=2,
    )
