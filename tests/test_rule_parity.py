"""One definition per rule (issue #10, item 1).

Each rule below is spelled in one module only, in the forms its callers need (ORM filter, SQL
text, Python); these tests fail if another module spells it again, and check that the forms of
one rule agree on real rows, on whichever database the suite runs on.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

import llm_budgets
from llm_budgets import budgets, client, usage
from llm_budgets.api.serializers import CommitRequestSerializer
from llm_budgets.control.killswitches import (
    switch_is_open,
    switch_open_param,
    switch_open_q,
    switch_open_sql,
)
from llm_budgets.db import statements as sql
from llm_budgets.engine import settlement
from llm_budgets.engine.applicable import applicable_budgets
from llm_budgets.engine.counters import counters_locked, counters_matching
from llm_budgets.engine.types import CounterKey
from llm_budgets.models import Counter, EndUser, KillSwitch, Price
from llm_budgets.pricing.prices import price_in_effect, prices_in_effect
from llm_budgets.tenancy.tenants import tenant_get
from tests.factories import reserve_30, seed

PACKAGE = Path(llm_budgets.__file__).parent

# rule -> (the one module allowed to spell it, the spellings that betray a second definition)
RULES: dict[str, tuple[set[str], list[str]]] = {
    "counter key": (
        {"engine/counters.py"},
        [
            r"budget_id,\s*\w+\.end_user_id,\s*\w+\.period_start",  # key tuples rebuilt
            r"end_user__isnull=True,\s*period_start",  # ORM lookup by key
            r"end_user_id=\w+,\s*period_start",
            r"column\(Counter,\s*['\"](period_start|end_user)['\"]\)",  # SQL lookup by key
            r"Counter\(\s*budget=\w+\.budget,\s*end_user=",  # a key's row built by hand
        ],
    ),
    "a kill switch is open now": (
        {"control/killswitches.py"},
        [
            r"auto_clear_at__(gt|gte|lte|lt|isnull)",
            r"auto_clear_at is None or",
            r"\.auto_clear_at\s*(>|<=)",  # a loaded switch's open state, worked out again
            r"auto_clear_at\S*\s+IS NULL",
            r"column\(KillSwitch,\s*['\"](auto_clear_at|cleared_at)['\"]\)",
            r"cleared_at__isnull",
        ],
    ),
    "the price version in effect": (
        {"pricing/prices.py"},
        [
            r"effective_from__(lte|lt)",
            r"effective_to__(isnull|gt|gte)",
            r"column\(Price,\s*['\"]effective_(from|to)['\"]\)",
        ],
    ),
}
# Declarations, not definitions: the schema and its history.
EXEMPT = ("models/", "migrations/")


def second_spellings(rule: str, files: dict[str, str]) -> list[str]:
    owners, patterns = RULES[rule]
    found = []
    for name, text in files.items():
        if name in owners or name.startswith(EXEMPT):
            continue
        for pattern in patterns:
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{name}:{line}: {match.group(0)}")
    return found


def package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE)): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))
    }


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_is_spelled_in_one_module(rule: str) -> None:
    assert second_spellings(rule, package_sources()) == []


# What the package spelled before the rules had one home: each must be caught.
SECOND_SPELLINGS = {
    "counter key": [
        "key = (counter.budget_id, counter.end_user_id, counter.period_start)",
        "Q(budget_id=budget_id, end_user__isnull=True, period_start=start)",
        "Q(budget_id=budget_id, end_user_id=end_user_id, period_start__gte=since)",
        "start = sql.column(Counter, 'period_start')",
        "Counter(budget=a.budget, end_user=a.end_user, period_start=a.period.start)",
    ],
    "a kill switch is open now": [
        "KillSwitch.objects.filter(tenant=tenant, cleared_at__isnull=True)",
        "Q(cleared_at__isnull=True, auto_clear_at__gt=now)",
        "obj.auto_clear_at is None or obj.auto_clear_at > timezone.now()",
        "cleared, auto_clear = sql.column(KillSwitch, 'cleared_at'), ...",
        'f" AND (k.auto_clear_at IS NULL OR k.auto_clear_at > %s))"',
        "if obj.auto_clear_at is not None and obj.auto_clear_at <= timezone.now():",
    ],
    "the price version in effect": [
        "Price.objects.filter(effective_from__lte=at)",
        "Q(effective_to__isnull=True) | Q(effective_to__gt=at)",
        'starts = sql.column(Price, "effective_from")',
    ],
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_second_spelling_is_caught(rule: str) -> None:
    for text in SECOND_SPELLINGS[rule]:
        assert second_spellings(rule, {"elsewhere.py": text}), text
        owner = next(iter(RULES[rule][0]))
        assert second_spellings(rule, {owner: text}) == []


# The usage arguments of a commit: ``llm_budgets.usage.Usage`` is the one definition.

USAGE_FIELDS = [f.name for f in dataclasses.fields(usage.Usage)]
USAGE_DEFAULTS = {
    f.name: None if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(usage.Usage)
}
COMMIT_SURFACES = {
    "usage.usage_validate": usage.usage_validate,
    "settlement.reservation_commit": settlement.reservation_commit,
    "budgets.commit": budgets.commit,
    "budgets.Hold.commit": budgets.Hold.commit,
    "client.BudgetsClient.commit": client.BudgetsClient.commit,
    "client.RemoteHold.commit": client.RemoteHold.commit,
}
# Parameters of a commit that are not usage counts.
NOT_USAGE = {"self", "reservation_id", "hold_id", "usage", "now", "idempotency_key"}


@pytest.mark.parametrize("name", sorted(COMMIT_SURFACES))
def test_every_commit_takes_the_usage_fields_with_the_same_defaults(name: str) -> None:
    params = inspect.signature(COMMIT_SURFACES[name]).parameters
    counts = [p for p in params if p not in NOT_USAGE]
    assert counts == USAGE_FIELDS
    for field in USAGE_FIELDS:
        default = params[field].default
        assert params[field].kind is inspect.Parameter.KEYWORD_ONLY
        if USAGE_DEFAULTS[field] is None:
            # Required (validation names it when missing), or a mapping (None: none).
            assert default in (None, inspect.Parameter.empty), (field, default)
        else:
            assert default == USAGE_DEFAULTS[field], (field, default)


def test_the_commit_request_body_is_the_usage_fields() -> None:
    fields = [f for f in CommitRequestSerializer().fields if f != "idempotency_key"]
    assert fields == USAGE_FIELDS


# The forms of one rule agree on real rows.

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.django_db
def test_the_three_forms_of_an_open_switch_agree() -> None:
    seed()
    tenant = tenant_get("acme")
    cases = {
        "never clears": {},
        "cleared": {"cleared_at": T0 - timedelta(hours=1)},
        "auto-clears later": {"auto_clear_at": T0 + timedelta(hours=1)},
        "auto-cleared": {"auto_clear_at": T0 - timedelta(seconds=1)},
        "auto-clears exactly now": {"auto_clear_at": T0},
        "cleared before its auto-clear": {
            "cleared_at": T0 - timedelta(hours=1),
            "auto_clear_at": T0 + timedelta(hours=1),
        },
    }
    for index, (reason, fields) in enumerate(cases.items()):
        KillSwitch.objects.create(
            tenant=tenant,
            model=f"m{index}",
            scope_key=f"case-{index}",
            reason=reason,
            tripped_at=T0 - timedelta(days=1),
            **fields,
        )
    open_at = {}
    for now in (T0 - timedelta(hours=2), T0, T0 + timedelta(hours=2)):
        orm = set(KillSwitch.objects.filter(switch_open_q(now)).values_list("reason", flat=True))
        text = (
            f"SELECT {sql.column(KillSwitch, 'reason')} FROM {sql.table(KillSwitch)} k"
            f" WHERE {switch_open_sql('k')}"
        )
        in_sql = {row[0] for row in sql.fetch(text, [switch_open_param(now)])}
        in_python = {s.reason for s in KillSwitch.objects.all() if switch_is_open(s, now)}
        assert orm == in_sql == in_python, now
        open_at[now] = orm
    # A switch whose auto-clear time has come no longer refuses; a cleared one never does.
    assert open_at[T0] == {"never clears", "auto-clears later"}
    assert open_at[T0 + timedelta(hours=2)] == {"never clears"}
    assert open_at[T0 - timedelta(hours=2)] == {
        "never clears",
        "auto-clears later",
        "auto-cleared",
        "auto-clears exactly now",
    }


@pytest.mark.django_db
def test_the_orm_and_sql_forms_of_the_price_in_effect_agree() -> None:
    def version(start: datetime, end: datetime | None, rate: str) -> None:
        Price.objects.create(
            provider="p",
            model="m",
            effective_from=start,
            effective_to=end,
            input_per_mtok=Decimal(rate),
            output_per_mtok=Decimal(rate),
        )

    version(T0, None, "1")
    version(T0 + timedelta(days=10), T0 + timedelta(days=20), "2")  # a bounded override
    version(T0 + timedelta(days=30), None, "3")
    for days in (-1, 0, 5, 10, 15, 20, 25, 30, 40):
        at = T0 + timedelta(days=days)
        newest = prices_in_effect(at).filter(provider="p", model="m").order_by("-effective_from")
        orm = newest.first()
        try:
            in_sql = price_in_effect(provider="p", model="m", at=at)  # the SQL form
        except llm_budgets.exceptions.UnknownPrice:
            in_sql = None
        assert (orm and orm.pk) == (in_sql and in_sql.pk), days
    assert price_in_effect(provider="p", model="m", at=T0 + timedelta(days=25)).input_per_mtok == 1


@pytest.mark.django_db
def test_the_orm_and_sql_forms_of_a_counter_lookup_agree() -> None:
    seed(limit="100")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("50"), window="day")
    for user in ("u-1", "u-2"):
        reserve_30(end_user=user).release()  # counters: the tenant's, and each user's share
    reserve_30().release()
    tenant = tenant_get("acme")
    user = EndUser.objects.get(external_id="u-1")
    applicable = applicable_budgets(tenant, user, datetime.now(UTC))
    keys = {item.counter_key for item in applicable}
    assert len(keys) == 2
    assert any(k.end_user_id == user.pk for k in keys)

    orm = {CounterKey.of(c) for c in Counter.objects.filter(counters_matching(applicable))}
    locked = {CounterKey.of(c) for c in counters_locked(applicable)}  # the SQL form
    assert orm == locked == keys
    # u-2's share of the same budget is not matched by either form.
    assert Counter.objects.count() == 3
