"""Reads for the tenant pages: the overview from counters (``reads.statuses.budget_statuses``,
the same figures as ``budgets.status()``), the charts and tables live (``reads.live``: the daily
rollups plus the ledger's lines since their watermark), refusals from their compact records.
Each function runs a fixed number of queries however many end users or ledger lines the tenant
has; the only ledger lines read are those written since the last rollup run.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import F, Q, Sum
from django.utils.translation import gettext as _

from llm_budgets.control.killswitches import kill_switches_in_state
from llm_budgets.engine.applicable import shared_by_tenants
from llm_budgets.jobs.thresholds import budget_thresholds
from llm_budgets.models import (
    Budget,
    Counter,
    EndUser,
    KillSwitch,
    Refusal,
    RefusalKind,
    Scope,
    Tenant,
    Window,
)
from llm_budgets.money import ZERO, round_charge
from llm_budgets.pages.access import Viewer
from llm_budgets.reads import live
from llm_budgets.reads.overviews import ScopedSubject, tenant_overview
from llm_budgets.reads.projections import with_projections
from llm_budgets.reads.statuses import budget_statuses, tenant_visible
from llm_budgets.reads.usage import END_USER_SORTS, Periods, end_user_named
from llm_budgets.results import BudgetStatus
from llm_budgets.windows import Period, tenant_period

# Rows per page of the tables; the end-user chart draws the top CHART_TOP of its sort order.
PAGE_ROWS = 50
CHART_TOP = 10

OK, WARNING, EXCEEDED = "ok", "warning", "exceeded"


@dataclass(frozen=True)
class BudgetLine:
    """One budget on the overview: its status (``budgets.status()``'s numbers) and how full it
    is against its warning thresholds."""

    status: BudgetStatus
    used_percent: Decimal  # (spent + reserved) / limit, 0 to 100 (capped for the bar)
    state: str  # OK, WARNING or EXCEEDED
    threshold: int | None  # the highest warning threshold reached
    thresholds: tuple[int, ...]  # the budget's warning thresholds, ascending
    end_user: str | None  # an end user's own budget: whose
    each_end_user: bool  # the limit every end user gets (no single spent figure)
    # For an each-end-user limit (admin view, calendar windows): how many users have used all of
    # it in the current window, and how many have reached its lowest warning threshold.
    users_at_limit: int | None = None
    users_warned: int | None = None


@dataclass(frozen=True)
class Overview:
    budgets: list[BudgetLine]
    end_user_budgets: list[BudgetLine]  # admin view: end users' own budgets, first PAGE_ROWS
    end_user_budget_count: int
    kill_switches: list[KillSwitch]
    # Admin view: the tenant's API key, run and tag budgets, and each key's and run's share of
    # an each-key / each-run budget, most used first (first PAGE_ROWS).
    scoped_budgets: list[tuple[BudgetLine, ScopedSubject]] = field(default_factory=list)


def _line(status: BudgetStatus, budget: Budget | None) -> BudgetLine:
    used = status.spent + status.reserved
    percent = (used * 100 / status.limit) if status.limit > 0 else Decimal(100 if used else 0)
    thresholds = budget_thresholds(budget) if budget is not None else []
    reached = [t for t in thresholds if percent >= t]
    if status.limit <= 0 or status.remaining <= 0:
        state = EXCEEDED
    elif reached:
        state = WARNING
    else:
        state = OK
    end_user = None
    if budget is not None and budget.scope == Scope.END_USER and budget.end_user is not None:
        end_user = budget.end_user.external_id
    return BudgetLine(
        status=status,
        used_percent=min(Decimal(100), percent).quantize(Decimal("0.1")),
        state=state,
        threshold=max(reached) if reached else None,
        thresholds=tuple(thresholds),
        end_user=end_user,
        each_end_user=status.scope == Scope.END_USER_DEFAULT and budget is not None,
    )


def _lines(statuses: list[BudgetStatus], tenant: Tenant) -> list[BudgetLine]:
    budgets = Budget.objects.select_related("end_user").in_bulk([s.budget_id for s in statuses])
    for budget in budgets.values():
        budget.tenant = tenant  # its plan's thresholds without a query per budget
    return [_line(s, budgets.get(s.budget_id)) for s in statuses]


# The order budgets appear in: the organisation's, then what each user may spend.
_SCOPE_ORDER = {Scope.TENANT: 0, Scope.END_USER: 1, Scope.END_USER_DEFAULT: 2}


def _visible(statuses: list[BudgetStatus]) -> list[BudgetStatus]:
    shown = tenant_visible(statuses)
    return sorted(shown, key=lambda s: _SCOPE_ORDER.get(Scope(s.scope), 3))


decimal_of = live.decimal_of


def end_user_of(viewer: Viewer) -> EndUser | None:
    """A member's end user (unsaved if the ledger has not seen it yet), None for the tenant."""
    if viewer.end_user is None:
        return None
    return end_user_named(viewer.tenant, viewer.end_user)


def overview(viewer: Viewer, at: datetime) -> Overview:
    """The budgets the viewer may see, with the figures ``budgets.status()`` gives for the same
    tenant (and, for a member, the same end user)."""
    tenant = viewer.tenant
    end_user = end_user_of(viewer)
    if end_user is None:
        data = tenant_overview(tenant, at)
        # The organisation's monthly budget with its projection (reads.projections).
        visible = with_projections(_visible(data.budgets), tenant, None, at)
        shared = [_with_users(line) for line in _lines(visible, tenant)]
        own = _lines(data.end_user_budgets, tenant)
        own_count = data.end_user_budget_count
        scoped = (
            list(zip(_lines(data.scoped_budgets, tenant), data.scoped_subjects, strict=True))
            if data.scoped_budgets
            else []
        )
    else:
        mine = [
            s
            for s in _visible(budget_statuses(tenant, end_user, at))
            if s.scope in (Scope.END_USER, Scope.END_USER_DEFAULT)
        ]
        lines = _lines(mine, tenant)
        # A member's share of an each-end-user limit is their own counter: show its figures.
        shared = [replace(line, each_end_user=False) for line in lines]
        # Runs, keys and tags are the organisation's: not a member's to see.
        own, own_count, scoped = [], 0, []
    return Overview(
        budgets=shared,
        end_user_budgets=own,
        end_user_budget_count=own_count,
        kill_switches=open_kill_switches(viewer, at),
        scoped_budgets=scoped,
    )


def _with_users(line: BudgetLine) -> BudgetLine:
    """An each-end-user limit with how many users reached it (one query on its counters)."""
    status = line.status
    if not line.each_end_user or status.window not in (Window.MONTH, Window.DAY, Window.HOUR):
        return line
    lowest = min(line.thresholds) if line.thresholds else None
    warn_at = status.limit * lowest / 100 if lowest is not None else None
    # Each user's use, summed over its stripes when the budget is hot (engine.stripes); only
    # users at the lowest threshold or above come back.
    floor = warn_at if warn_at is not None else status.limit
    per_user = (
        Counter.objects.filter(
            budget_id=status.budget_id,
            period_start=status.period_start,
            end_user__isnull=False,
        )
        .values("end_user_id")
        .annotate(used=Sum(F("spent") + F("reserved")))
        .filter(used__gte=floor)
        .values_list("used", flat=True)
    )
    used = [round_charge(Decimal(str(u))) for u in per_user]
    at_limit = sum(1 for u in used if u >= status.limit)
    warned = sum(1 for u in used if warn_at is not None and u >= warn_at)
    state = EXCEEDED if at_limit else WARNING if warned else OK
    return replace(line, users_at_limit=at_limit, users_warned=warned, state=state)


def open_kill_switches(viewer: Viewer, at: datetime) -> list[KillSwitch]:
    """Open switches that stop some of the viewer's calls: installation-wide ones (all calls, a
    provider, a model) and the tenant's own (for a member: the tenant's and their own)."""
    tenant = viewer.tenant
    own = Q(tenant=tenant)
    if viewer.end_user is not None:
        own &= Q(end_user__isnull=True) | Q(end_user__external_id=viewer.end_user)
    wide = Q(tenant__isnull=True, api_key__isnull=True)
    return list(kill_switches_in_state("open", at).filter(own | wide).order_by("-tripped_at"))


# Charts


def _grouped(
    viewer: Viewer, periods: Periods, group_by: str, unit: str, *, period: Period | None = None
) -> list[dict[str, Any]]:
    """A period's (default: the current one) live usage of what the viewer may see, grouped."""
    first, last = periods.days(period or periods.current)
    if period is not None and period != periods.current:
        # After a change of timezone the periods' local days may overlap by one: count it once.
        last = min(last, periods.days(periods.current)[0] - timedelta(days=1))
    return live.usage_grouped(
        viewer.tenant,
        since=first,
        until=last,
        group_by=group_by,
        unit=unit,
        end_user=end_user_of(viewer),
    )


@dataclass(frozen=True)
class DayBar:
    day: date
    amount: Decimal
    previous: Decimal | None  # the same day of the previous period, if it has one
    calls: int


def spend_by_day(viewer: Viewer, periods: Periods, unit: str) -> list[DayBar]:
    """Each local day of the current period beside the same day of the previous one."""
    current = {r["day"]: r for r in _grouped(viewer, periods, "day", unit)}
    previous_rows = _grouped(viewer, periods, "day", unit, period=periods.previous)
    first, last = periods.days(periods.current)
    before_first, before_last = periods.days(periods.previous)
    before = {(r["day"] - before_first).days: r["total"] for r in previous_rows}
    length_before = (before_last - before_first).days + 1
    bars = []
    day = first
    while day <= last:
        index = (day - first).days
        row = current.get(day)
        bars.append(
            DayBar(
                day=day,
                amount=row["total"] if row else ZERO,
                previous=before.get(index, ZERO) if index < length_before else None,
                calls=row["n_calls"] if row else 0,
            )
        )
        day += timedelta(days=1)
    return bars


@dataclass(frozen=True)
class UsageRow:
    label: str
    amount: Decimal
    calls: int
    input_tokens: int
    output_tokens: int
    share: Decimal  # percent of the period's total
    short_label: str = ""  # for the chart, where space is short (the label if empty)

    def __post_init__(self) -> None:
        if not self.short_label:
            object.__setattr__(self, "short_label", self.label)


def _usage_row(row: dict[str, Any], label: str, total: Decimal, short: str = "") -> UsageRow:
    amount = row["total"]
    return UsageRow(
        label=label,
        amount=amount,
        calls=row["n_calls"],
        input_tokens=row["n_input"],
        output_tokens=row["n_output"],
        share=(amount * 100 / total).quantize(Decimal("0.1")) if total else ZERO,
        short_label=short,
    )


def period_total(viewer: Viewer, periods: Periods, unit: str) -> Decimal:
    """The current period's total spend the viewer may see, live (rollups plus the tail)."""
    return sum((r["total"] for r in _grouped(viewer, periods, "day", unit)), ZERO)


def spend_by_model(viewer: Viewer, periods: Periods, unit: str) -> list[UsageRow]:
    """The current period's spend per model, largest first."""
    rows = _grouped(viewer, periods, "model", unit)
    rows.sort(key=lambda r: (-r["total"], r["provider"], r["model"]))
    total = sum((r["total"] for r in rows), ZERO)
    return [_usage_row(r, f"{r['model']} ({r['provider']})", total, short=r["model"]) for r in rows]


def spend_by_day_and_model(
    viewer: Viewer, periods: Periods, unit: str
) -> dict[tuple[date, str], Decimal]:
    """The current period's spend per local day and model name (the stacked chart)."""
    spend: dict[tuple[date, str], Decimal] = {}
    for row in _grouped(viewer, periods, "day_model", unit):
        key = (row["day"], row["model"])
        spend[key] = spend.get(key, ZERO) + row["total"]
    return spend


def period_budget(viewer: Viewer, at: datetime, unit: str) -> BudgetStatus | None:
    """The monthly budget the period's charts are drawn against, with its projection: the
    organisation's, or a member's own; None if there is none in the charts' unit."""
    end_user = end_user_of(viewer)
    wanted = (Scope.TENANT,) if end_user is None else (Scope.END_USER, Scope.END_USER_DEFAULT)
    for status in budget_statuses(viewer.tenant, end_user, at):
        if status.scope in wanted and status.window == Window.MONTH and status.unit == unit:
            return status
    return None


def spend_by_end_user(
    viewer: Viewer, periods: Periods, unit: str, *, sort: str, page: int
) -> tuple[Page[UsageRow], list[UsageRow], Decimal]:
    """The current period's spend per end user: one page in ``sort`` order
    (``END_USER_SORTS``), the top CHART_TOP by spend for the chart, and the period's total. One
    aggregate query; sorting and paging the (at most one per end user) rows happen here."""
    rows = _grouped(viewer, periods, "end_user", unit)
    total = sum((r["total"] for r in rows), ZERO)

    def usage(row: dict[str, Any]) -> UsageRow:
        return _usage_row(row, row["end_user__external_id"] or _("(calls without a user)"), total)

    rows.sort(key=END_USER_SORTS.get(sort, END_USER_SORTS["amount"]))
    # The chart's top spenders: the first rows when sorted by spend, else picked without a sort.
    by_amount = END_USER_SORTS["amount"]
    top = rows[:CHART_TOP] if sort == "amount" else heapq.nsmallest(CHART_TOP, rows, key=by_amount)
    current = Paginator(rows, PAGE_ROWS).get_page(page)
    lines = [usage(r) for r in current.object_list]
    return Page(lines, current.number, current.paginator), [usage(r) for r in top], total  # type: ignore[arg-type]


# Refusals


@dataclass(frozen=True)
class RefusalLine:
    refusal: Refusal
    end_user: str | None
    budget_label: str
    window: str
    resets_at: datetime | None  # when the budget's period that refused it ended or ends
    # Refused by the budget every tenant shares: what was left of it is not theirs to see.
    shared: bool = False
    # It needed more than the budget's whole limit (as the limit is now): no reset cures that.
    beyond_limit: bool = False


def refusals(viewer: Viewer, *, page: int) -> Page[RefusalLine]:
    """Recent refusals, newest first, one page."""
    rows = Refusal.objects.filter(tenant=viewer.tenant).select_related(
        "budget", "budget__end_user", "kill_switch"
    )
    if viewer.end_user is not None:
        # By the id the call named: a refused call creates no end user (issue #22.9).
        rows = rows.filter(end_user_external_id=viewer.end_user)
    paginator = Paginator(rows.order_by("-created_at", "-id"), PAGE_ROWS)
    current = paginator.get_page(page)
    lines = [_refusal_line(r, viewer.tenant) for r in current.object_list]
    return Page(lines, current.number, paginator)  # type: ignore[arg-type]


def _refusal_line(refusal: Refusal, tenant: Tenant) -> RefusalLine:
    budget = refusal.budget
    resets_at = None
    label, window = "", ""
    if refusal.kind == RefusalKind.BUDGET and budget is not None:
        budget.tenant = tenant
        window = budget.window
        label = budget_kind_label(
            budget.scope, budget.end_user.external_id if budget.end_user else None
        )
        period = tenant_period(budget.window, refusal.created_at, tenant)
        resets_at = period.end
    return RefusalLine(
        refusal=refusal,
        end_user=refusal.end_user_external_id or None,
        budget_label=label,
        window=window,
        resets_at=resets_at,
        shared=budget is not None and shared_by_tenants(budget.scope),
        beyond_limit=budget is not None
        and not shared_by_tenants(budget.scope)
        and refusal.requested is not None
        and refusal.requested > budget.limit,
    )


def budget_kind_label(scope: str, end_user: str | None) -> str:
    """A budget's scope in a tenant's words."""
    if scope == Scope.TENANT:
        return _("Your organisation")
    if scope == Scope.END_USER_DEFAULT:
        return _("Each user")
    if scope == Scope.END_USER:
        return _("User %(name)s") % {"name": end_user}
    return _("Overall service limit")


def tenants_to_pick(query: str, *, page: int = 1) -> Page[Tenant]:
    """Support's tenant picker: tenants whose id or name contains ``query`` (all when empty),
    by id, ``PAGE_ROWS`` a page (two queries)."""
    tenants = Tenant.objects.order_by("external_id").only("external_id", "name", "timezone")
    if query:
        tenants = tenants.filter(Q(external_id__icontains=query) | Q(name__icontains=query))
    return Paginator(tenants, PAGE_ROWS).get_page(page)
