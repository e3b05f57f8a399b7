"""A month of plausible usage for the demo's tenant pages, through the services.

Every call is a real reservation and commit (``reservation_create`` / ``reservation_commit`` with
an earlier clock), so counters, the ledger, refusals and the daily rollups are exactly what
production would hold. Idempotent: each call carries an idempotency key, so a second run finds
its reservations instead of adding more; refusals are attempted only once per tenant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from llm_budgets.engine.admission import reservation_create
from llm_budgets.engine.settlement import reservation_commit
from llm_budgets.exceptions import BudgetError
from llm_budgets.jobs.rollups import daily_usage_rebuild
from llm_budgets.models import Membership, MembershipRole, Refusal, Tenant

DAYS = 40  # the previous billing month and the current one, whatever today's date
# tenant: end users and how busy each is (mean calls per working day)
USERS = {
    "acme": {"alice": 3, "bob": 2, "carol": 2, "dave": 1, "erin": 1, "frank": 1, "grace": 1},
    "globex": {"g-1001": 3, "g-1002": 2, "g-1003": 1, "g-1004": 1},
    "initech": {"i-1": 1, "i-2": 1},
}
# provider, model, share of calls, input tokens (range), output tokens (range)
MODELS = [
    ("openai", "gpt-4o-mini", 40, (4_000, 40_000), (200, 1_500)),
    ("openai", "gpt-4o", 25, (8_000, 60_000), (400, 1_800)),
    ("anthropic", "claude-3-5-haiku-20241022", 20, (5_000, 40_000), (200, 1_200)),
    ("anthropic", "claude-sonnet-4-20250514", 15, (10_000, 70_000), (500, 1_900)),
]
OUTPUT_CEILING = 2_000
# Logins for the usage pages (random passwords, printed by the demo data command).
PAGE_USERS = [
    ("acme-admin", "acme", MembershipRole.ADMIN, ""),
    ("globex-admin", "globex", MembershipRole.ADMIN, ""),
    ("alice", "acme", MembershipRole.MEMBER, "alice"),
]


@dataclass(frozen=True)
class MonthCall:
    key: str
    tenant: str
    end_user: str
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    at: datetime


def month_calls(now: datetime) -> list[MonthCall]:
    """The calls of the last DAYS days (fewer at weekends), the same on every run of a day."""
    rng = random.Random(20261201)  # noqa: S311 - demo data, not a secret
    calls = []
    for tenant, users in USERS.items():
        for days_ago in range(DAYS, -1, -1):
            weekend = (now - timedelta(days=days_ago)).weekday() >= 5
            for user, busy in users.items():
                count = rng.randint(0, busy * 2)
                if weekend:
                    count //= 3
                if days_ago == 0 and user == next(iter(users)):
                    count = max(count, 1)  # today has usage, even on the billing day itself
                for index in range(count):
                    provider, model, _, inputs, outputs = rng.choices(
                        MODELS, weights=[m[2] for m in MODELS]
                    )[0]
                    minutes = rng.randint(8 * 60, 19 * 60)
                    calls.append(
                        MonthCall(
                            key=f"demo-month-{tenant}-{user}-{days_ago}-{index}",
                            tenant=tenant,
                            end_user=user,
                            provider=provider,
                            model=model,
                            input_tokens=rng.randint(*inputs),
                            output_tokens=rng.randint(*outputs),
                            at=_local(now, days_ago, minutes, tenant),
                        )
                    )
    # Today's later calls happen "just now" instead: the same keys, so a second run finds them.
    latest = now - timedelta(minutes=1)
    return [c if c.at < latest else replace(c, at=latest) for c in calls]


def _local(now: datetime, days_ago: int, minutes: int, tenant: str) -> datetime:
    zone = ZoneInfo(Tenant.objects.get(external_id=tenant).timezone)
    day = (now.astimezone(zone) - timedelta(days=days_ago)).date()
    return datetime.combine(day, time(0), tzinfo=zone) + timedelta(minutes=minutes)


def demo_month_load(*, now: datetime | None = None) -> dict[str, int]:
    """Reserve and commit the month's calls (a call a budget refuses is recorded as a refusal,
    as in production), then rebuild the rollups the pages read. Returns counts by outcome."""
    now = now or timezone.now()
    outcome = {"committed": 0, "refused": 0}
    # One transaction for the lot (each admission is a savepoint in it): on SQLite a commit per
    # call would make the demo wait on the disk a thousand times.
    with transaction.atomic():
        _calls(now, outcome)
        _refusals(now)
    daily_usage_rebuild(since=(now - timedelta(days=DAYS + 2)).date(), until=now.date())
    return outcome


def _calls(now: datetime, outcome: dict[str, int]) -> None:
    for call in month_calls(now):
        try:
            reservation = reservation_create(
                tenant=call.tenant,
                end_user=call.end_user,
                provider=call.provider,
                model=call.model,
                input_tokens=call.input_tokens,
                max_output_tokens=OUTPUT_CEILING,
                idempotency_key=call.key,
                tags={"feature": "chat" if call.output_tokens < 600 else "reports"},
                now=call.at,
            )
        except BudgetError:
            outcome["refused"] += 1
            continue
        reservation_commit(
            reservation.pk,
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            now=call.at + timedelta(seconds=3),
        )
        outcome["committed"] += 1


def _refusals(now: datetime) -> None:
    """A few calls too big for the per-user daily limit, once: the refused-calls page."""
    if Refusal.objects.filter(tenant__external_id="acme").exists():
        return
    for days_ago, user in ((9, "frank"), (4, "bob"), (1, "erin")):
        try:
            reservation_create(
                tenant="acme",
                end_user=user,
                provider="anthropic",
                model="claude-sonnet-4-20250514",
                input_tokens=500_000,
                max_output_tokens=64_000,
                now=_local(now, days_ago, 15 * 60, "acme"),
            )
        except BudgetError:
            continue


def page_users_ensure(password: str) -> list[str]:
    """The usage pages' demo logins (memberships), all with ``password``. Returns usernames."""
    user_model = get_user_model()
    for username, tenant, role, end_user in PAGE_USERS:
        lookup: dict[str, Any] = {user_model.USERNAME_FIELD: username}
        user, _ = user_model._default_manager.get_or_create(**lookup)
        user.set_password(password)
        user.save()
        Membership.objects.update_or_create(
            user=user,
            tenant=Tenant.objects.get(external_id=tenant),
            defaults={"role": role, "end_user_external_id": end_user},
        )
    return [username for username, *_ in PAGE_USERS]
