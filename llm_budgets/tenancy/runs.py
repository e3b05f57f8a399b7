"""Runs: one agent run (or any unit of work the host names) inside a tenant, so a budget can cap
it (``set_limit(run="run-42")``, or ``run="*"`` for each run). A run is created on first sight,
race-free, and closed once: its lifetime ends there, and admission refuses it afterwards."""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from llm_budgets import hooks, validation
from llm_budgets.clock import time_field
from llm_budgets.exceptions import RunClosed
from llm_budgets.models import AuditEvent, Counter, Run, Tenant
from llm_budgets.tenancy.tenants import tenant_get

ALL_RUNS = validation.ALL_RUNS


def run_validate(value: object, *, field: str = "run") -> str:
    """A run's id: an identifier, never ``"*"`` (which names every run in ``set_limit`` only)."""
    return validation.run_id(field, value)


def run_ensure(tenant: Tenant, external_id: str) -> Run:
    """The run, created on first sight. Concurrent first calls all get the same row."""
    try:
        return Run.objects.get(tenant=tenant, external_id=external_id)
    except Run.DoesNotExist:
        # ON CONFLICT DO NOTHING, then read: whoever inserted first, everyone sees one row.
        Run.objects.bulk_create(
            [Run(tenant=tenant, external_id=external_id)], ignore_conflicts=True
        )
        return Run.objects.get(tenant=tenant, external_id=external_id)


def run_refuse_if_closed(run: Run) -> None:
    """Raise ``RunClosed`` if the run has been closed."""
    if run.closed_at is not None:
        raise RunClosed(tenant=run.tenant.external_id, run=run.external_id, closed_at=run.closed_at)


def run_close(
    *, tenant: str, run: object, actor: str = "", reason: str = "", now: datetime | None = None
) -> Run:
    """Close a run: its lifetime ends, and every later reservation naming it is refused
    (``RunClosed``). Holds already taken settle as usual. Closing a closed run changes nothing.
    The close locks the run's counters (in pk order, as admission does) before it commits, and
    admission reads the close once it holds them: no reservation is admitted after the close
    commits, and one admitted meanwhile is admitted before it."""
    run_id = run_validate(run)
    tenant_obj = tenant_get(tenant)
    with transaction.atomic():
        run_ensure(tenant_obj, run_id)
        no_key = connection.features.has_select_for_no_key_update
        row = Run.objects.select_for_update(no_key=no_key).get(
            tenant=tenant_obj, external_id=run_id
        )
        if row.closed_at is not None:
            return row
        # The counters of its budgets: its share of each-run budgets and its own budgets'.
        list(
            Counter.objects.select_for_update(of=("self",))
            .filter(Q(run=row) | Q(budget__run=row))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        row.closed_at = now or timezone.now()
        row.closed_by = actor
        row.save(update_fields=["closed_at", "closed_by"])
        AuditEvent.objects.create(
            action="run.close",
            actor=actor,
            tenant=tenant_obj,
            target=f"run {run_id} of {tenant_obj.external_id}",
            before=None,
            after={"closed_at": row.closed_at.isoformat()},
            reason=reason,
        )
        hooks.event_record(
            "run.closed",
            tenant=tenant_obj,
            body={
                "tenant": tenant_obj.external_id,
                "run": run_id,
                "closed_by": actor,
                "reason": reason,
                "closed_at": time_field(row.closed_at),
            },
            guard=f"run {run_id}",
        )
    row.tenant = tenant_obj
    return row
