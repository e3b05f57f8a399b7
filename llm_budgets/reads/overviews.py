"""Reads for the tenant and end-user overviews (the admin's pages and the tenant pages): where each
of a tenant's budgets stands, its open holds.

Every function here runs a fixed number of queries, however many end users, budgets or holds the
tenant has: the admin page must stay fast for the biggest tenant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce

from llm_budgets.control.killswitches import kill_switches_in_state
from llm_budgets.engine.applicable import applicable_budgets
from llm_budgets.engine.lines import FLOOR_ACTION
from llm_budgets.engine.types import ApplicableBudget
from llm_budgets.models import (
    LIVE_STATES,
    SHARED_BY,
    ApiKey,
    AuditEvent,
    Budget,
    BudgetRaise,
    Counter,
    EndUser,
    KillSwitch,
    Refusal,
    Reservation,
    Run,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.reads.statuses import statuses_for
from llm_budgets.results import BudgetStatus
from llm_budgets.windows import ROLLING_PREFIX, budget_period, tenant_period

# Rows shown per table; the page links to the full, filtered changelist beyond that.
TENANT_PAGE_ROWS = 50
# Recent ledger lines on an end user's page (as on the tenant page): the list has the rest.
RECENT_LINES = 20


@dataclass(frozen=True)
class TenantOverview:
    budgets: list[BudgetStatus]  # global, the tenant's own, and its each-end-user default
    end_user_budgets: list[BudgetStatus]  # end users' own budgets, first TENANT_PAGE_ROWS
    end_user_budget_count: int
    open_reservations: list[Reservation]  # HELD, soonest to expire first
    open_reservation_count: int
    raises: dict[int, list[BudgetRaise]]  # the raises in force on those budgets, by budget id
    created: dict[int, datetime]  # when each budget was created (it counts from then)
    # Issue #16: the tenant's API key, run and tag budgets; for a "*" budget, its shares (each
    # key's or run's counter) with the most used first, first TENANT_PAGE_ROWS.
    scoped_budgets: list[BudgetStatus] = field(default_factory=list)
    # What each of scoped_budgets names, for labels a page translates.
    scoped_subjects: list[ScopedSubject] = field(default_factory=list)


@dataclass(frozen=True)
class ScopedSubject:
    """What an API key, run or tag budget (or a key's or run's share of ``*``) names:
    ``kind`` is ``run``, ``api_key`` or ``tag``; ``name`` the run id, key prefix or
    ``key=value``."""

    kind: str
    name: str

    @classmethod
    def of(cls, item: ApplicableBudget) -> ScopedSubject:
        budget = item.budget
        run = item.run or budget.run
        key = item.api_key or budget.api_key
        if run is not None:
            return cls("run", run.external_id)
        if key is not None:
            return cls("api_key", key.prefix)
        return cls("tag", f"{budget.tag_key}={budget.tag_value}")


# The scopes a call names beyond its tenant and end user, and their "*" defaults.
_NAMED_SCOPES = [Scope.API_KEY, Scope.RUN, Scope.TAG]
_SHARED_SCOPES = [Scope.API_KEY_DEFAULT, Scope.RUN_DEFAULT]


def scoped_budgets(
    tenant: Tenant, at: datetime, rows: int = TENANT_PAGE_ROWS
) -> list[tuple[BudgetStatus, ScopedSubject]]:
    """The tenant's API key, run and tag budgets where they stand now, and the shares of its
    each-key and each-run budgets in their current periods, most used first, each with what it
    names. One query when the tenant has none, four at most."""
    budgets = list(
        Budget.objects.filter(tenant=tenant, scope__in=[*_NAMED_SCOPES, *_SHARED_SCOPES])
        .select_related("api_key", "run")
        .order_by("scope", "window")
    )
    applicable = []
    current = Q(pk__in=[])
    shared = {}
    for budget in budgets:
        budget.tenant = tenant  # labels without a query per row
        period = tenant_period(budget.window, at, tenant)
        if budget.scope in _NAMED_SCOPES:
            applicable.append(ApplicableBudget(budget, period))
        elif not budget.window.startswith(ROLLING_PREFIX):
            shared[budget.pk] = (budget, period)
            current |= Q(budget_id=budget.pk, period_start=period.start)
    applicable = applicable[:rows]
    if shared:
        # One row per share, summed over a hot budget's stripes.
        shares = list(
            Counter.objects.filter(current)
            .values("budget_id", "run_id", "api_key_id")
            .annotate(used=Sum(F("spent") + F("reserved")), first=Min("pk"))
            .order_by("-used", "first")[:rows]
        )
        runs = Run.objects.in_bulk({s["run_id"] for s in shares if s["run_id"] is not None})
        keys = ApiKey.objects.in_bulk(
            {s["api_key_id"] for s in shares if s["api_key_id"] is not None}
        )
        for share in shares:
            budget, period = shared[share["budget_id"]]
            applicable.append(
                ApplicableBudget(
                    budget,
                    period,
                    run=runs.get(share["run_id"]),
                    api_key=keys.get(share["api_key_id"]),
                )
            )
    if not applicable:
        return []
    subjects = [ScopedSubject.of(item) for item in applicable]
    return list(zip(statuses_for(applicable), subjects, strict=True))


def tenant_overview(tenant: Tenant, at: datetime) -> TenantOverview:
    """The tenant's budgets with the current period's numbers, and its open reservations."""
    rows = TENANT_PAGE_ROWS
    # An unsaved end user: the statuses of what applies to every end user, no one's own budget.
    shared_applicable = applicable_budgets(tenant, EndUser(tenant=tenant), at)
    shared = statuses_for(shared_applicable)
    own_budgets = Budget.objects.filter(tenant=tenant, scope=Scope.END_USER)
    own = list(
        own_budgets.select_related("end_user").order_by("end_user__external_id", "window")[:rows]
    )
    applicable = []
    raises = active_raises([*(s.budget_id for s in shared), *(b.pk for b in own)], at)
    for budget in own:
        budget.tenant = tenant  # labels without a query per row
        raised = sum((r.amount for r in raises.get(budget.pk, [])), Decimal(0))
        applicable.append(
            ApplicableBudget(budget, tenant_period(budget.window, at, tenant), raised=raised)
        )
    # Open: still counted in reserved (held, or uncertain until usage or the reconcile job).
    held = Reservation.objects.filter(tenant=tenant, state__in=LIVE_STATES)
    open_reservations = list(held.select_related("end_user").order_by("expires_at")[:rows])
    scoped = scoped_budgets(tenant, at)
    return TenantOverview(
        budgets=shared,
        end_user_budgets=statuses_for(applicable),
        end_user_budget_count=own_budgets.count(),
        open_reservations=open_reservations,
        open_reservation_count=held.count(),
        raises=raises,
        created={a.budget.pk: a.budget.created_at for a in [*shared_applicable, *applicable]},
        scoped_budgets=[status for status, _ in scoped],
        scoped_subjects=[subject for _, subject in scoped],
    )


def active_raises(budget_ids: Iterable[int], at: datetime) -> dict[int, list[BudgetRaise]]:
    """Temporary raises in force at ``at``, per budget, ending soonest first (one query)."""
    found: dict[int, list[BudgetRaise]] = defaultdict(list)
    for grant in BudgetRaise.objects.filter(
        budget_id__in=list(budget_ids), starts_at__lte=at, ends_at__gt=at
    ).order_by("ends_at"):
        found[grant.budget_id].append(grant)
    return found


def budget_list_statuses(budgets: Sequence[Budget], at: datetime) -> dict[int, BudgetStatus]:
    """This period's numbers for a page of budgets, in three queries however many. An
    each-end-user, each-run or each-key (``*``) budget has one counter per end user, run or key:
    it has no single status here."""
    raises = active_raises([b.pk for b in budgets], at)
    applicable = [
        ApplicableBudget(
            budget,
            budget_period(budget, at),
            raised=sum((r.amount for r in raises.get(budget.pk, [])), Decimal(0)),
        )
        for budget in budgets
        if budget.scope not in SHARED_BY
    ]
    return {status.budget_id: status for status in statuses_for(applicable)}


def adjustment_notes(lines: Sequence[UsageRecord]) -> dict[int, AuditEvent]:
    """For the compensating lines among ``lines``: the audit event that wrote each (who, why).
    One query: the void and reset events of those tenants since the oldest of the lines."""
    adjustments = [line for line in lines if line.kind == UsageKind.ADJUSTMENT]
    if not adjustments:
        return {}
    since = min(line.created_at for line in adjustments) - timedelta(minutes=1)
    events = AuditEvent.objects.filter(
        action__in=[
            "usage.void",
            "end_user.reset_spend",
            "run.reset_spend",
            "budget.reset_spend",
            FLOOR_ACTION,
        ],
        tenant_id__in={line.tenant_id for line in adjustments},
        created_at__gte=since,
    )
    by_line: dict[int, AuditEvent] = {}
    for event in events:
        after = event.after if isinstance(event.after, dict) else {}
        ids = after.get("lines") or [after.get("adjustment_id")]
        for line_id in ids:
            if isinstance(line_id, int):
                by_line[line_id] = event
    return {line.pk: by_line[line.pk] for line in adjustments if line.pk in by_line}


def voided_ids(lines: Sequence[UsageRecord]) -> dict[int, int]:
    """Which of ``lines`` are voided: line id -> the id of the line voiding it (one query)."""
    return dict(
        UsageRecord.objects.filter(voids__in=[line.pk for line in lines]).values_list(
            "voids_id", "pk"
        )
    )


@dataclass(frozen=True)
class RefusalGroup:
    """Refusals of the same end user, model and reason in a burst (each within ``BURST`` of the
    previous one), shown as one row with a count."""

    first: Refusal  # the newest
    count: int
    oldest_at: datetime


BURST = timedelta(minutes=10)


def refusal_groups(refusals: Sequence[Refusal]) -> list[RefusalGroup]:
    """``refusals`` (newest first) with identical consecutive ones in a burst folded together."""
    groups: list[RefusalGroup] = []
    for refusal in refusals:
        if groups:
            last = groups[-1]
            same = (
                last.first.end_user_external_id == refusal.end_user_external_id
                and last.first.model == refusal.model
                and last.first.kind == refusal.kind
                and last.first.detail == refusal.detail
            )
            if same and last.oldest_at - refusal.created_at <= BURST:
                groups[-1] = RefusalGroup(last.first, last.count + 1, refusal.created_at)
                continue
        groups.append(RefusalGroup(refusal, 1, refusal.created_at))
    return groups


def _identical(ref: Callable[[str], Any]) -> QuerySet[Refusal]:
    """Refusals identical to the row ``ref`` points at (``OuterRef``, or an ``OuterRef`` of
    one): same tenant, end user (or none), model, kind and detail. The tenant's time index
    serves it (a refusal always has a tenant; one without one is never grouped)."""
    return Refusal.objects.filter(
        tenant_id=ref("tenant_id"),
        end_user_external_id=ref("end_user_external_id"),
        model=ref("model"),
        kind=ref("kind"),
        detail=ref("detail"),
    )


def _near(ref: Callable[[str], Any], *, after: bool) -> Q:
    """Within ``BURST`` after (or before) the row ``ref`` points at; ties broken by id."""
    at = ref("created_at")
    if after:
        edge = ExpressionWrapper(at + BURST, output_field=DateTimeField())
        return Q(created_at__lte=edge) & (Q(created_at__gt=at) | Q(created_at=at, pk__gt=ref("pk")))
    edge = ExpressionWrapper(at - BURST, output_field=DateTimeField())
    return Q(created_at__gte=edge) & (Q(created_at__lt=at) | Q(created_at=at, pk__lt=ref("pk")))


def refusal_bursts(refusals: QuerySet[Refusal]) -> QuerySet[Refusal]:
    """``refusals`` with each burst of identical ones (each within ``BURST`` of the next) as one
    row: its newest refusal, annotated with ``burst_count`` and ``burst_since`` (when the burst
    began). Done in the database, so the admin's filters, search, sorting and pagination work
    on the bursts. Unlike :func:`refusal_groups` (the pages' recent rows), a burst is not broken
    by other refusals in between."""
    outer = OuterRef
    later = _identical(outer).filter(_near(outer, after=True))
    # Where the head's burst began: the newest identical refusal at or before it with no
    # identical one within BURST before it.
    starts = (
        _identical(outer)
        .filter(
            Q(created_at__lt=outer("created_at"))
            | Q(created_at=outer("created_at"), pk__lte=outer("pk"))
        )
        .filter(
            ~Exists(
                _identical(lambda name: OuterRef(name)).filter(
                    _near(lambda name: OuterRef(name), after=False)
                )
            )
        )
        .order_by("-created_at", "-pk")
        .values("created_at")[:1]
    )
    since = Subquery(starts, output_field=DateTimeField())
    count = (
        _identical(outer)
        .filter(created_at__gte=outer("burst_since"))
        .filter(
            Q(created_at__lt=outer("created_at"))
            | Q(pk__lte=outer("pk"), created_at=outer("created_at"))
        )
        .order_by()
        .values("tenant_id")
        .annotate(total=Count("pk"))
        .values("total")
    )
    return (
        refusals.filter(~Exists(later))
        .annotate(burst_since=since)
        .annotate(burst_count=Coalesce(Subquery(count, output_field=IntegerField()), 1))
    )


RECENT_RUNS = 20


def end_user_runs(end_user: EndUser, at: datetime, rows: int = RECENT_RUNS) -> list[BudgetStatus]:
    """The run budgets of the end user's most recent runs (those its calls named), newest
    first: each run's own budgets and its share of the tenant's each-run (``"*"``) budgets.
    Three queries however many runs; a run no budget covers has no row."""
    tenant = end_user.tenant
    runs = list(
        Run.objects.filter(
            tenant=tenant,
            pk__in=Reservation.objects.filter(end_user=end_user, run__isnull=False).values("run"),
        ).order_by("-created_at", "-pk")[:rows]
    )
    if not runs:
        return []
    by_run: dict[int, list[Budget]] = defaultdict(list)
    each: list[Budget] = []
    for budget in Budget.objects.filter(tenant=tenant).filter(
        Q(scope=Scope.RUN_DEFAULT) | Q(scope=Scope.RUN, run__in=runs)
    ):
        budget.tenant = tenant  # labels without a query per row
        if budget.run_id is None:
            each.append(budget)
        else:
            by_run[budget.run_id].append(budget)
    applicable = []
    for run in runs:
        run.tenant = tenant
        for budget in sorted(by_run[run.pk], key=lambda b: b.window):
            budget.run = run
            applicable.append(ApplicableBudget(budget, tenant_period(budget.window, at, tenant)))
        applicable.extend(
            ApplicableBudget(budget, tenant_period(budget.window, at, tenant), run=run)
            for budget in sorted(each, key=lambda b: b.window)
        )
    return statuses_for(applicable) if applicable else []


@dataclass(frozen=True)
class EndUserOverview:
    budgets: list[BudgetStatus]  # every budget that applies to the end user, this period
    open_reservations: list[Reservation]
    open_reservation_count: int
    lines: list[UsageRecord]
    refusals: list[Refusal]
    switches: list[KillSwitch]  # open switches that stop this end user (any model)
    created: dict[int, datetime]  # when each budget was created (it counts from then)
    runs: list[BudgetStatus] = field(default_factory=list)  # its recent runs' run budgets


def end_user_overview(end_user: EndUser, at: datetime) -> EndUserOverview:
    """Where an end user stands: the same numbers admission uses (``budget_statuses``), its open
    holds, recent ledger lines and refusals, and the switches covering it. Fixed query count."""
    tenant = end_user.tenant
    held = Reservation.objects.filter(end_user=end_user, state__in=LIVE_STATES)
    rows = TENANT_PAGE_ROWS
    lines = UsageRecord.objects.filter(end_user=end_user).select_related("end_user")
    # Open by the switch module's own rule; global, provider- and model-wide ones cover this
    # end user too.
    switches = list(
        kill_switches_in_state("open", at)
        .filter(Q(tenant__isnull=True) | Q(tenant=tenant))
        .filter(Q(end_user__isnull=True) | Q(end_user=end_user))
        .select_related("tenant", "end_user__tenant", "api_key")
    )
    applicable = applicable_budgets(tenant, end_user, at)
    return EndUserOverview(
        budgets=statuses_for(applicable),
        created={a.budget.pk: a.budget.created_at for a in applicable},
        open_reservations=list(held.select_related("end_user").order_by("expires_at")[:rows]),
        open_reservation_count=held.count(),
        lines=list(lines[:RECENT_LINES]),
        refusals=list(
            # By the id asked: refusals from before the end user's first admitted call too.
            Refusal.objects.filter(
                tenant=tenant, end_user_external_id=end_user.external_id
            ).select_related("end_user", "budget")[:rows]
        ),
        switches=switches,
        runs=end_user_runs(end_user, at),
    )
