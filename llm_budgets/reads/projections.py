"""Projections: where a budget will stand at the end of its period at the recent burn rate, and
when it would run out before it resets.

The method (docs/pages.md, "Projections"), for a budget of a calendar day or month:

1. The history is the spend of the last ``HISTORY_DAYS`` complete local days (the tenant's
   timezone; live: ``reads.live``), whatever period they fall in, of what the budget counts: the
   tenant's spend for a tenant budget, the end user's for an end user's own.
2. The weekly pattern is taken out: with two whole weeks of history, each weekday's share of the
   average day (a team that works Monday to Friday spends little at weekends); else none.
3. A straight line is fitted through the days without their pattern by least squares, each day
   weighted by ``0.5 ** (age / HALF_LIFE_DAYS)``: a trend, with recent days counting most. With
   fewer than ``MIN_TREND_DAYS`` days of history the line is flat at their weighted mean; with
   none there is no projection.
4. The projected spend is what is used now (spent + reserved: the budget's own figures) plus the
   line's spend, with each weekday's share put back, from now to the end of the period (never
   negative: a falling trend stops at zero). It runs out where that running total reaches the
   limit, if before the reset.

Its error, measured on a synthetic month with a known trend and weekly pattern
(tests/test_projections.py), is stated in docs/pages.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from llm_budgets.models import EndUser, Scope, Tenant, Window
from llm_budgets.money import round_charge
from llm_budgets.reads import live
from llm_budgets.results import BudgetStatus

HISTORY_DAYS = 28
# Budgets whose period a daily history can look ahead over: the rest of today, the rest of the
# month. Not an hour (daily history says nothing of the next minutes), a rolling window (it
# never resets: it has no end of period to project to) or a lifetime budget (no end either).
PROJECTED_WINDOWS = frozenset({Window.DAY, Window.MONTH})
HALF_LIFE_DAYS = 14
MIN_TREND_DAYS = 7
# Where the running total is looked at to find when it reaches the limit.
STEPS_PER_DAY = 24

METHOD = (
    f"a least-squares line through the last {HISTORY_DAYS} complete days' spend without their "
    f"weekly pattern, weighted by recency (half-life {HALF_LIFE_DAYS} days), extended to the end "
    "of the period with the pattern put back"
)


@dataclass(frozen=True)
class Projection:
    projected: Decimal  # used now plus the line's spend to the end of the period
    runs_out_at: datetime | None  # when used + projected spend reaches the limit, if before end
    rate: Decimal  # the line's spend per day now


# Decimal throughout (money is never a float, even in a forecast); within a step a total this
# close to the limit has reached it.
ONE, HALF, ZERO_D = Decimal(1), Decimal("0.5"), Decimal(0)
EPSILON = Decimal("1e-9")
DAY_US = Decimal(86_400_000_000)  # microseconds in a day


def _days(span: timedelta) -> Decimal:
    """A span in days, exactly."""
    return Decimal(span // timedelta(microseconds=1)) / DAY_US


def _span(days: Decimal) -> timedelta:
    """A number of days as a span, to the nearest whole second (what a person is told)."""
    return timedelta(seconds=int((days * 86_400).to_integral_value()))


def _weekday_factors(history: Sequence[Decimal], first_weekday: int) -> list[Decimal]:
    """How much each weekday spends against the average day (Monday first), from whole weeks of
    history only; 1 for every day without two whole weeks."""
    n = len(history) - len(history) % 7
    if n < 14:
        return [ONE] * 7
    recent = list(history[-n:])
    start = (first_weekday + len(history) - n) % 7
    mean = sum(recent, ZERO_D) / n
    if mean <= 0:
        return [ONE] * 7
    factors = [ZERO_D] * 7
    for i, value in enumerate(recent):
        factors[(start + i) % 7] += value / (n // 7) / mean
    return factors


def _line(history: Sequence[Decimal]) -> tuple[Decimal, Decimal]:
    """Intercept and slope (per day) of the weighted line through the history, oldest first;
    a day's spend sits at its middle, the start of today at 0."""
    n = len(history)
    xs = [Decimal(i - n) + HALF for i in range(n)]
    ws = [HALF ** (Decimal(n - 1 - i) / HALF_LIFE_DAYS) for i in range(n)]
    total = sum(ws, ZERO_D)
    mean_x = sum((w * x for w, x in zip(ws, xs, strict=True)), ZERO_D) / total
    mean_y = sum((w * y for w, y in zip(ws, history, strict=True)), ZERO_D) / total
    if n < MIN_TREND_DAYS:
        return mean_y, ZERO_D
    spread = sum((w * (x - mean_x) ** 2 for w, x in zip(ws, xs, strict=True)), ZERO_D)
    slope = sum(
        (w * (x - mean_x) * (y - mean_y) for w, x, y in zip(ws, xs, history, strict=True)), ZERO_D
    )
    slope = slope / spread if spread else ZERO_D
    return mean_y - slope * mean_x, slope


def project(
    *,
    used: Decimal,
    limit: Decimal,
    history: Sequence[Decimal],
    now: datetime,
    day_start: datetime,
    period_end: datetime,
) -> Projection | None:
    """The projection of a budget whose used (spent + reserved) is ``used`` now, from the spend of
    the complete local days before today (``history``, oldest first, ending yesterday; today
    starts at ``day_start``, in the tenant's timezone)."""
    if not history:
        return None
    today = day_start.weekday()
    factors = _weekday_factors(history, (today - len(history)) % 7)
    first = (today - len(history)) % 7
    level = [
        v / factors[(first + i) % 7] if factors[(first + i) % 7] else ZERO_D
        for i, v in enumerate(history)
    ]
    intercept, slope = _line(level)
    position = _days(now - day_start)
    end = _days(period_end - day_start)
    step = ONE / STEPS_PER_DAY
    running, reached, runs_out_at = used, used >= limit, None
    while position < end - EPSILON:
        following = min(position + step, end)
        middle = (position + following) / 2
        factor = factors[(today + int(middle)) % 7]
        before = running
        running += max(intercept + slope * middle, ZERO_D) * factor * (following - position)
        if not reached and running >= limit - EPSILON:
            # Where in the step (the rate is even within one) the total reaches the limit.
            within = (limit - before) / (running - before) if running > before else ZERO_D
            moment = day_start + _span(position + within * (following - position))
            reached, runs_out_at = True, moment.replace(microsecond=0)
        position = following
    projected = round_charge(max(used, running))
    rate = max(intercept + slope * _days(now - day_start), ZERO_D) * factors[today]
    return Projection(projected=projected, runs_out_at=runs_out_at, rate=round_charge(rate))


def _series_owner(
    status: BudgetStatus, end_user: EndUser | None
) -> tuple[bool, EndUser | None] | None:
    """Whose spend a budget counts, as (projectable, end user); None: not projected."""
    if status.window not in PROJECTED_WINDOWS or status.resets_at is None or status.limit <= 0:
        return None
    if status.scope == Scope.TENANT:
        return True, None
    if status.scope in (Scope.END_USER, Scope.END_USER_DEFAULT) and end_user is not None:
        return True, end_user
    return None


def with_projections(
    statuses: Sequence[BudgetStatus], tenant: Tenant, end_user: EndUser | None, at: datetime
) -> list[BudgetStatus]:
    """The statuses with ``projected`` and ``runs_out_at`` set where a projection applies: the
    tenant's and an end user's daily and monthly budgets (an end user's share of an
    each-end-user limit when ``end_user`` is given). Others are returned as they are. One live
    read (four queries) per series projected: a daily and a monthly budget share theirs."""
    zone = ZoneInfo(tenant.timezone)
    local = at.astimezone(zone)
    day_start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    today = local.date()
    histories: dict[tuple[int | None, str], list[Decimal]] = {}
    result = []
    for status in statuses:
        owner = _series_owner(status, end_user)
        if owner is None:
            result.append(status)
            continue
        user = owner[1]
        key = (user.pk if user is not None else None, status.unit)
        if key not in histories:
            spend = live.daily_spend(
                tenant,
                since=today - timedelta(days=HISTORY_DAYS),
                until=today - timedelta(days=1),
                unit=status.unit,
                end_user=user,
            )
            first = min(spend, default=today)
            days = (today - first).days
            histories[key] = [spend.get(first + timedelta(days=i), Decimal(0)) for i in range(days)]
        assert status.resets_at is not None
        found = project(
            used=status.spent + status.reserved,
            limit=status.limit,
            history=histories[key],
            now=at,
            day_start=day_start,
            period_end=status.resets_at,
        )
        if found is None:
            result.append(status)
        else:
            result.append(replace(status, projected=found.projected, runs_out_at=found.runs_out_at))
    return result
