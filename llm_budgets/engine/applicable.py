"""Reads: which budgets apply to a request, and where each stands now. No writes and no locks
here: counter rows are locked by key in ``llm_budgets.engine.counters``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from llm_budgets.control.killswitches import switch_open_sql
from llm_budgets.db import dbclock
from llm_budgets.db import statements as sql
from llm_budgets.engine.types import NO_SCOPES, ApplicableBudget, CallScopes
from llm_budgets.models import (
    SHARED_BY,
    ApiKey,
    Budget,
    BudgetRaise,
    EndUser,
    KillSwitch,
    Price,
    Run,
    Scope,
    Tenant,
)
from llm_budgets.money import ZERO, round_charge
from llm_budgets.pricing.prices import version_in_effect_sql
from llm_budgets.results import BudgetStatus as BudgetStatus
from llm_budgets.tags import tags_validate  # its home until issue #10
from llm_budgets.tenancy.runs import run_validate
from llm_budgets.tenancy.tenants import (
    end_user_columns_sql,
    end_user_from_row,
    end_user_from_sql,
    end_user_row_width,
    end_user_where_sql,
)
from llm_budgets.windows import period_for, tenant_period


def scopes_for_read(
    tenant: Tenant, *, run: object = None, tags: object = None, api_key: ApiKey | None = None
) -> CallScopes:
    """The run, key and tags a status, quote or explanation asks about, read without creating
    anything: a run not seen yet shows the budgets it would get (``run="*"``'s, at zero)."""
    run_obj = None
    if run is not None:
        run_id = run_validate(run)
        run_obj = Run.objects.filter(tenant=tenant, external_id=run_id).first() or Run(
            tenant=tenant, external_id=run_id
        )
        run_obj.tenant = tenant
    tag_map = tags_validate(tags)
    return CallScopes(run=run_obj, api_key=api_key, tags=tuple(sorted(tag_map.items())))


def applicable_budgets(
    tenant: Tenant, end_user: EndUser | None, at: datetime, scopes: CallScopes = NO_SCOPES
) -> list[ApplicableBudget]:
    """Global, tenant, and the end user's own budgets (each replacing the ``*`` default for
    its window), and those of the run, API key and tags the call names (``scopes``), each with
    the period that contains ``at``."""
    # One statement without the ORM's compilation (see ``llm_budgets.db.statements``); active
    # raises ride along as a subquery: no extra round trip on the admission path.
    when = sql.param(BudgetRaise, "starts_at", at)
    params: list[object] = [when, when, tenant.pk]
    if end_user is not None:
        params.append(end_user.pk)  # None for an end user not yet saved: matches nothing
    if any(scopes.shape):
        params += [tenant.pk, *scopes.params]  # the tenant again: ``_budgets_applying``
    rows = sql.fetch(_applicable_sql(end_user is not None, scopes.shape), params)
    return _applicable(rows, 0, tenant, end_user, at, scopes)


def _applicable(
    rows: Sequence[Sequence[Any]],
    offset: int,
    tenant: Tenant,
    end_user: EndUser | None,
    at: datetime,
    scopes: CallScopes = NO_SCOPES,
) -> list[ApplicableBudget]:
    """``applicable_budgets`` from rows holding a budget's columns at ``offset``, followed by
    the sum of its active raises."""
    budgets = [sql.row_to(Budget, row, offset) for row in rows]
    # SQLite sums decimals as floats: back to the stored precision through their text.
    raised_at = offset + sql.width(Budget)
    raised_by = {
        budget.pk: round_charge(Decimal(str(row[raised_at]))) if row[raised_at] else ZERO
        for budget, row in zip(budgets, rows, strict=True)
    }
    # An end user's, run's or key's own budget replaces the ``"*"`` default for its window.
    own_windows = {(b.scope, b.window) for b in budgets}
    result = []
    for budget in budgets:
        own = _OWN_SCOPE.get(Scope(budget.scope))
        if own is not None and (own, budget.window) in own_windows:
            continue
        # Attach the objects we already have, so labels cost no queries.
        budget.tenant = tenant if budget.tenant_id else None
        if budget.scope == Scope.END_USER:
            budget.end_user = end_user
        elif budget.scope == Scope.RUN:
            budget.run = scopes.run
        elif budget.scope == Scope.API_KEY:
            budget.api_key = scopes.api_key
        if budget.scope == Scope.GLOBAL:
            period = period_for(budget.window, at)
        else:
            period = tenant_period(budget.window, at, tenant)
        shared_by = SHARED_BY.get(Scope(budget.scope))
        result.append(
            ApplicableBudget(
                budget,
                period,
                end_user if shared_by == "end_user" else None,
                raised_by[budget.pk],
                run=scopes.run if shared_by == "run" else None,
                api_key=scopes.api_key if shared_by == "api_key" else None,
            )
        )
    return result


# The ``"*"`` scopes and the scope of a budget of one's own that replaces them for a window.
_OWN_SCOPE = {
    Scope.END_USER_DEFAULT: Scope.END_USER,
    Scope.RUN_DEFAULT: Scope.RUN,
    Scope.API_KEY_DEFAULT: Scope.API_KEY,
}


@functools.cache
def _applicable_sql(with_end_user: bool, shape: tuple[bool, bool, int] = (False, False, 0)) -> str:
    """``applicable_budgets``'s one statement: the budgets, each with the sum of its active
    raises. Parameters: the time twice, the tenant id, the end user id if ``with_end_user``,
    then ``CallScopes.params`` of this ``shape``."""
    return (
        f"SELECT {_budget_columns()} FROM {sql.table(Budget)} b"  # noqa: S608
        f" WHERE {_budgets_applying('%s', '%s' if with_end_user else None, shape)}"
        f" ORDER BY {_budget_order()}"
    )


def _budget_order() -> str:
    """``Budget.Meta.ordering`` (as the ORM would order them), then the id."""
    fields = [*(Budget._meta.ordering or ()), "id"]
    return ", ".join(f"b.{sql.column(Budget, str(f))}" for f in fields)


def _budget_columns(at: str = "%s") -> str:
    """A budget's columns (alias ``b``) and the sum of its raises active at the time ``at``, an
    SQL expression (by default a parameter: then two, the time twice)."""
    raised = (
        f"SELECT SUM(r.{sql.column(BudgetRaise, 'amount')}) FROM {sql.table(BudgetRaise)} r"  # noqa: S608
        f" WHERE r.{sql.column(BudgetRaise, 'budget')} = b.id"
        f" AND r.{sql.column(BudgetRaise, 'starts_at')} <= {at}"
        f" AND r.{sql.column(BudgetRaise, 'ends_at')} > {at}"
    )
    return f"{sql.columns(Budget, 'b')}, ({raised})"


def _budgets_applying(
    tenant_id: str,
    end_user_id: str | None,
    shape: tuple[bool, bool, int] = (False, False, 0),
    run_id: str = "%s",
) -> str:
    """The condition on budget ``b`` for a tenant's (and end user's) request; the ids are SQL
    expressions (a placeholder or a joined column). ``shape`` (``CallScopes.shape``): whether the
    call names a run and an API key, and how many tags; their ids and names are placeholders,
    after the end user's, in the order of ``CallScopes.params``, preceded by ``tenant_id`` once
    more if any. ``run_id``: the run's id as an SQL expression (a joined column, or by default
    a placeholder, the first of ``CallScopes.params``)."""
    scope, tenant = f"b.{sql.column(Budget, 'scope')}", f"b.{sql.column(Budget, 'tenant')}"
    tenant_scopes = f"'{Scope.TENANT.value}'"
    end_user = ""
    if end_user_id is not None:
        tenant_scopes += f", '{Scope.END_USER_DEFAULT.value}'"
        end_user = (
            f" OR (b.{sql.column(Budget, 'end_user')} = {end_user_id}"
            f" AND {scope} = '{Scope.END_USER.value}')"
        )
    with_run, with_key, tag_count = shape
    named = []
    if with_run:
        tenant_scopes += f", '{Scope.RUN_DEFAULT.value}'"
        named.append(
            f"(b.{sql.column(Budget, 'run')} = {run_id} AND {scope} = '{Scope.RUN.value}')"
        )
    if with_key:
        tenant_scopes += f", '{Scope.API_KEY_DEFAULT.value}'"
        named.append(
            f"(b.{sql.column(Budget, 'api_key')} = %s AND {scope} = '{Scope.API_KEY.value}')"
        )
    if tag_count:
        key, value = sql.column(Budget, "tag_key"), sql.column(Budget, "tag_value")
        pairs = " OR ".join([f"(b.{key} = %s AND b.{value} = %s)"] * tag_count)
        named.append(f"({scope} = '{Scope.TAG.value}' AND ({pairs}))")
    # The run's, key's and tags' own budgets, of this tenant only (an operator key may have a
    # budget in several tenants); ``tenant_id`` again, then ``CallScopes.params``.
    own = f" OR ({tenant} = {tenant_id} AND ({' OR '.join(named)}))" if named else ""
    return (
        f"({scope} = '{Scope.GLOBAL.value}'"
        f" OR ({tenant} = {tenant_id} AND {scope} IN ({tenant_scopes})){end_user}{own})"
    )


@dataclass(frozen=True)
class AdmissionContext:
    """What admission reads before its transaction, for a known end user: one statement."""

    tenant: Tenant
    end_user: EndUser
    price: Price | None  # the version in effect for the provider and model; None: not priced
    applicable: list[ApplicableBudget]
    # Whether any kill switch is open at all; when none is, admission skips reading which
    # switches cover the call (a trip committed after this read is missed either way).
    any_switch_open: bool
    # The time everything above was read at: the one given, else the database's clock.
    at: datetime
    # The run the call names, read with its tenant (None if it names none, or one not seen yet:
    # then ``applicable`` is empty and the caller reads it again once the run exists).
    run: Run | None = None


def admission_context(
    *,
    tenant: str,
    end_user: str,
    provider: str,
    model: str,
    at: datetime | None,
    scopes: CallScopes = NO_SCOPES,
    run: str | None = None,
) -> AdmissionContext | None:
    """The end user with its tenant and plan, the price version in effect at ``at``, the run
    named ``run`` (its external id) and the budgets that apply (with those of the run and of the
    key and tags in ``scopes``, which names no run), in one statement; None if the end user has
    not been seen yet (the caller then reads them one by one, creating the end user).

    ``at`` None: the time is the database's clock, read in the same statement
    (``db.dbclock``) and returned as ``AdmissionContext.at``."""
    assert scopes.run is None, "the run is read here: pass its id as run="
    shape = (run is not None, scopes.api_key is not None, len(scopes.tags))
    time = [] if at is None else [sql.param(BudgetRaise, "starts_at", at)]
    params = [
        *time,
        *time,
        *time,
        provider,
        model,
        *time,
        *time,
        *([run] if run is not None else []),
        *scopes.params,
        tenant,
        end_user,
    ]
    rows = sql.fetch(_admission_context_sql(shape, at is None), params)
    if not rows:
        return None
    first = rows[0]
    user = end_user_from_row(first)
    at_price = end_user_row_width()
    at_run = at_price + sql.width(Price)
    at_budget = at_run + (sql.width(Run) if run is not None else 0)
    price = None if first[at_price] is None else sql.row_to(Price, first, at_price)
    when = at if at is not None else dbclock.from_value(first[-1])
    any_switch_open = bool(first[-1] if at is not None else first[-2])
    run_obj = None
    if run is not None and first[at_run] is not None:
        run_obj = sql.row_to(Run, first, at_run)
        run_obj.tenant = user.tenant
    applicable = []
    if run is None or run_obj is not None:
        with_budget = [row for row in rows if row[at_budget] is not None]
        read = CallScopes(run=run_obj, api_key=scopes.api_key, tags=scopes.tags)
        applicable = _applicable(with_budget, at_budget, user.tenant, user, when, read)
    return AdmissionContext(
        tenant=user.tenant,
        end_user=user,
        price=price,
        applicable=applicable,
        any_switch_open=any_switch_open,
        at=when,
        run=run_obj,
    )


@functools.cache
def _admission_context_sql(
    shape: tuple[bool, bool, int] = (False, False, 0), database_clock: bool = False
) -> str:
    """One row per applicable budget (one with NULL budget columns if none), each carrying the
    end user, tenant, plan, price version and (if ``shape`` names a run) the run, then whether
    any kill switch is open and, with ``database_clock``, the database's time. Parameters: the
    time three times (raises, switches), provider, model, the time twice (price), the run's
    external id if named, ``CallScopes.params`` of this ``shape`` without a run, tenant and end
    user external ids; with ``database_clock`` every time is the database's (no parameter)."""
    at = dbclock.now_sql() if database_clock else "%s"
    switch_open = (
        f"EXISTS (SELECT 1 FROM {sql.table(KillSwitch)} k WHERE {switch_open_sql('k', at)})"  # noqa: S608
    )
    with_run = shape[0]
    run_columns = f" {sql.columns(Run, 'rn')}," if with_run else ""
    run_join = (
        f" LEFT JOIN {sql.table(Run)} rn ON rn.{sql.column(Run, 'tenant')} = t.id"
        f" AND rn.{sql.column(Run, 'external_id')} = %s"
        if with_run
        else ""
    )
    clock = f", {at}" if database_clock else ""
    return (
        f"SELECT {end_user_columns_sql()}, {sql.columns(Price, 'v')},{run_columns}"
        f" {_budget_columns(at)}, {switch_open}{clock} {end_user_from_sql()}"
        f" LEFT JOIN {sql.table(Price)} v ON v.id = ({version_in_effect_sql('id', at)})"
        f"{run_join}"
        f" LEFT JOIN {sql.table(Budget)} b ON {_budgets_applying('t.id', 'u.id', shape, 'rn.id')}"
        f" {end_user_where_sql()} ORDER BY {_budget_order()}"
    )


def shared_by_tenants(scope: str) -> bool:
    """Whether a budget of this scope counts every tenant's spend (the installation-wide cap).
    Its figures are shared state: a tenant's key or page may learn that it refused or would
    refuse a call, never its limit, spent, reserved or remaining (DESIGN.md section 3.6)."""
    return scope == Scope.GLOBAL
