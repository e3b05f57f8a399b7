"""End users and runs a call names for the first time: created by the transaction that admits
the call, so a refused call leaves no row (issue #22.9), and within a per-tenant cap on how many
new ones a tenant's calls bring in per 24 hours (``NEW_END_USERS_PER_DAY``, ``NEW_RUNS_PER_DAY``).

Admission builds the call with unsaved ``EndUser`` / ``Run`` objects (no id: their own budgets
cannot exist yet, so only the ``"*"`` budgets apply) and, inside its transaction and before it
locks anything, calls :meth:`FirstSight.create`: the usual ``end_user_ensure`` / ``run_ensure``
(insert ``ON CONFLICT DO NOTHING``, read the row back), now inside that transaction.
Concurrent first calls of one end user all get the same row: the second insert waits for the
first transaction, then finds its row (committed) or inserts its own (rolled back), so each
admission locks the one counter of that user's default budget and none passes it.

The cap is exact: a call that would create a row takes the tenant's turn for that kind first
(an advisory lock on PostgreSQL, held to the end of its transaction), then counts. Only first
calls of new ids wait for it; calls for ids seen before never take it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.db.models import Min
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.exceptions import NewIdCapped
from llm_budgets.models import EndUser, Reservation, Run
from llm_budgets.tenancy.runs import run_ensure
from llm_budgets.tenancy.tenants import end_user_ensure

# The cap's period: a rolling 24 hours, counted on the rows' creation times.
CAP_PERIOD = timedelta(days=1)


@dataclass(frozen=True)
class FirstSight:
    """The call's end user and run that had no row when the call was read (None: seen)."""

    end_user: EndUser | None = None
    run: Run | None = None

    def __bool__(self) -> bool:
        return self.end_user is not None or self.run is not None

    def create(self, reservation: Reservation) -> None:
        """Inside the admitting transaction, first: the rows, whoever inserts them (a concurrent
        first call's is as good), their ids set on the objects the call and its budgets hold;
        ``NewIdCapped`` if one is new and its tenant is at the cap."""
        if self.end_user is not None:
            user = self.end_user
            _within_cap(user, conf.NEW_END_USERS_PER_DAY, "end_user")
            user.pk = end_user_ensure(user.tenant, user.external_id).pk
            reservation.end_user = user  # the foreign key takes the id now known
        if self.run is not None:
            # A run closed meanwhile (staff close a run by id, seen or not) is refused once the
            # counters are locked, as any closed run (``admission._refuse_if_run_closed``).
            run = self.run
            _within_cap(run, conf.NEW_RUNS_PER_DAY, "run")
            run.pk = run_ensure(run.tenant, run.external_id).pk
            reservation.run = run

    def forget(self, reservation: Reservation) -> None:
        """After the transaction rolled back: the rows it made are gone, and so are their ids
        (a refusal record names the new end user by its id as asked, not by a row)."""
        if self.end_user is not None:
            self.end_user.pk = None
            reservation.end_user_id = None
        if self.run is not None:
            self.run.pk = None
            reservation.run_id = None


def _within_cap(obj: EndUser | Run, cap: int | None, kind: str) -> None:
    """``NewIdCapped`` if ``obj`` would be a new row and its tenant is at the cap; then the
    tenant's turn for new rows of its kind is held to the transaction's end."""
    if cap is None:
        return
    model = type(obj)
    rows = model.objects.filter(tenant_id=obj.tenant_id, external_id=obj.external_id)
    if rows.exists():
        return
    _one_creator_at_a_time(model, obj.tenant_id)
    if not rows.exists():  # not created by the call that had the turn before
        _refuse_if_capped(model, obj, cap, kind)


def _one_creator_at_a_time(model: type[EndUser | Run], tenant_id: int) -> None:
    """Serialise the tenant's new rows of ``model`` until the transaction ends, so the cap is
    counted exactly (PostgreSQL: a transaction-scoped advisory lock; SQLite's transactions
    already take the database's write lock at BEGIN). Taken before any row lock, end users'
    before runs': the lock order stays canonical."""
    if connection.vendor == "postgresql":
        key = f"llm_budgets.new_{model._meta.model_name}:{tenant_id}"
        sql.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])


def _refuse_if_capped(model: type[EndUser | Run], obj: EndUser | Run, cap: int, kind: str) -> None:
    """Count at most ``cap`` of the tenant's rows created in the period (index
    ``llmb_enduser_tenant_new`` / ``llmb_run_tenant_new``)."""
    since = timezone.now() - CAP_PERIOD
    recent = model.objects.filter(tenant_id=obj.tenant_id, created_at__gte=since)
    if recent.order_by()[:cap].count() < cap:
        return
    oldest = recent.aggregate(oldest=Min("created_at"))["oldest"] or since
    wait = (oldest + CAP_PERIOD - timezone.now()).total_seconds()
    raise NewIdCapped(
        tenant=obj.tenant.external_id,
        kind=kind,
        new_id=obj.external_id,
        cap=cap,
        retry_after=max(1, math.ceil(wait)),
    )
