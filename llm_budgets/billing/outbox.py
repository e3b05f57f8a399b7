"""The outbox: one row per ledger line of a linked tenant, in the same transaction as the line.

Settlement adds :func:`settlement_statements` to the statements that write the line (on PostgreSQL
they go in one round trip, so the outbox costs no extra one). A tenant the process knows is not
linked (a cached set, :func:`tenant_may_be_linked`) gets no statement at all; otherwise the
statement inserts the row only if the tenant's link is active, decided by the database.
Corrections written through the ORM call :func:`line_add`.

A tenant linked later, a line committed while its tenant was being linked, or by a process whose
cache did not know the link yet, is covered by :func:`outbox_catch_up`, which adds the rows of
lines that have none (at linking, and by delivery until ``CATCH_UP_MARGIN`` after it).
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Exists, OuterRef, Q, Subquery

from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.db.cached import CachedSet
from llm_budgets.models import (
    BillingLine,
    Reservation,
    StripeCustomerLink,
    StripePlanMeter,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.models.ledger import UsageRecordQuerySet
from llm_budgets.money import ZERO

# Stripe accepts meter events whose timestamp is at most 35 days old.
STRIPE_WINDOW = timedelta(days=35)


def _settlement_columns() -> str:
    """The columns a settlement's outbox row is inserted with (the row names its line by
    reservation and kind)."""
    fields = (
        "reservation",
        "kind",
        "tenant",
        "customer_id",
        "event_name",
        "amount",
        "currency",
        "occurred_at",
    )
    return ", ".join(sql.column(BillingLine, f) for f in fields)


@functools.cache
def _settlement_sql() -> str:
    """Insert the outbox row of a settlement's ledger line if its tenant is linked: the row names
    the line by (reservation, kind), unique for charge and true-up lines (the line itself is
    inserted by another clause of the same statement on PostgreSQL, so it cannot be read here)."""
    line, link = BillingLine, StripeCustomerLink
    names = _settlement_columns()
    amount = "CAST(%s AS NUMERIC)" if connection.vendor == "postgresql" else "%s"
    return (
        f"INSERT INTO {sql.table(line)} ({names})"  # noqa: S608
        f" SELECT %s, %s, l.{sql.column(link, 'tenant')}, l.{sql.column(link, 'customer_id')},"
        f" COALESCE(m.{sql.column(StripePlanMeter, 'event_name')}, %s), {amount}, %s, %s"
        f" FROM {sql.table(link)} l"
        f" JOIN {sql.table(Tenant)} t ON t.id = l.{sql.column(link, 'tenant')}"
        f" LEFT JOIN {sql.table(StripePlanMeter)} m"
        f" ON m.{sql.column(StripePlanMeter, 'plan')} = t.{sql.column(Tenant, 'plan')}"
        f" WHERE l.{sql.column(link, 'tenant')} = %s"
        f" AND l.{sql.column(link, 'unlinked_at')} IS NULL"
    )


def settlement_statements(
    reservation: Reservation, *, kind: str, customer_cost: Decimal, now: datetime
) -> list[sql.Statement]:
    """The statement writing the outbox row of the ledger line a settlement writes (charge or
    true-up of ``reservation``), to run with the line's own statements; none when the tenant is
    known not to be linked (:func:`tenant_may_be_linked`), so unlinked tenants pay nothing."""
    if not tenant_may_be_linked(reservation.tenant_id):
        return []
    params = [
        sql.param(BillingLine, "reservation", reservation.pk),
        kind,
        conf.STRIPE_METER_EVENT_NAME,
        sql.param(BillingLine, "amount", customer_cost),
        reservation.currency,
        sql.param(BillingLine, "occurred_at", now),
        reservation.tenant_id,
    ]
    return [(_settlement_sql(), params)]


def estimate_rows(source: sql.Statement, clock: sql.Statement) -> sql.Statement:
    """Insert the outbox rows of a sweep batch's estimate lines: one per reservation ``r`` of
    ``source`` (a FROM clause and its parameters) whose tenant's link is active, billing the
    held customer amount as its line does, at ``clock`` (an SQL expression and its parameters).
    Set-based, from the reservation rows, so the batch's lines need not be read back."""
    line, link = BillingLine, StripeCustomerLink
    names = _settlement_columns()
    tenant = sql.column(Reservation, "tenant")
    text = (
        f"INSERT INTO {sql.table(line)} ({names})"  # noqa: S608
        f" SELECT r.id, %s, r.{tenant}, l.{sql.column(link, 'customer_id')},"
        f" COALESCE(m.{sql.column(StripePlanMeter, 'event_name')}, %s),"
        f" r.{sql.column(Reservation, 'customer_amount')}, r.{sql.column(Reservation, 'currency')},"
        f" {clock[0]} FROM {source[0]}"
        f" JOIN {sql.table(link)} l ON l.{sql.column(link, 'tenant')} = r.{tenant}"
        f" AND l.{sql.column(link, 'unlinked_at')} IS NULL"
        f" JOIN {sql.table(Tenant)} t ON t.id = r.{tenant}"
        f" LEFT JOIN {sql.table(StripePlanMeter)} m"
        f" ON m.{sql.column(StripePlanMeter, 'plan')} = t.{sql.column(Tenant, 'plan')}"
    )
    return text, [UsageKind.CHARGE.value, conf.STRIPE_METER_EVENT_NAME, *clock[1], *source[1]]


# The ids of linked tenants, per process, re-read at most every 30 seconds (one small query).
# Stale for at most that long after a link made by another process: the lines such a process
# commits meanwhile are added by ``outbox_catch_up``, which delivery runs for every link until
# CATCH_UP_MARGIN after it was made. A stale "linked" costs nothing: the statement's own join
# decides.
CATCH_UP_MARGIN = timedelta(minutes=10)
LINKED = CachedSet(
    30.0,
    lambda: StripeCustomerLink.objects.filter(unlinked_at__isnull=True).values_list(
        "tenant_id", flat=True
    ),
)


def tenant_may_be_linked(tenant_id: int) -> bool:
    return tenant_id in LINKED.get()


def linked_cache_clear() -> None:
    """Forget the cached linked tenants (this process re-reads them on its next settlement)."""
    LINKED.clear()


def _event_name(tenant: Tenant) -> str:
    if tenant.plan_id is None:
        return conf.STRIPE_METER_EVENT_NAME
    meter = StripePlanMeter.objects.filter(plan_id=tenant.plan_id).first()
    return meter.event_name if meter else conf.STRIPE_METER_EVENT_NAME


def _row_of(record_id: int) -> Q:
    """The outbox row of a ledger line (named directly, or by reservation and kind)."""
    line = UsageRecord.objects.filter(pk=record_id).values("reservation_id", "kind").first()
    named = Q(usage_record_id=record_id)
    if line is None or line["kind"] == UsageKind.ADJUSTMENT:
        return named
    return named | Q(reservation_id=line["reservation_id"], kind=line["kind"])


def _billable(record: UsageRecord, queued: frozenset[int] = frozenset()) -> Decimal:
    """What a ledger line bills: its customer cost. A reset (an adjustment of one counter) moves a
    limit, not money: it bills nothing. A void of a line that was never queued for Stripe (booked
    before a link, more than 35 days back) bills nothing either: it would credit what was never
    billed (docs/billing.md, "Corrections"). ``queued``: lines being queued with this one."""
    if not record.is_spend:
        return ZERO
    if (
        record.voids_id is not None
        and record.voids_id not in queued
        and not BillingLine.objects.filter(_row_of(record.voids_id)).exists()
    ):
        return ZERO
    return record.customer_cost


def line_add(record: UsageRecord) -> BillingLine | None:
    """The outbox row of a ledger line written through the ORM (a void, a reset), in the
    caller's transaction. None when the tenant is not linked (catch-up adds it on linking)."""
    link = StripeCustomerLink.objects.filter(
        tenant_id=record.tenant_id, unlinked_at__isnull=True
    ).first()
    if link is None:
        return None
    return BillingLine.objects.create(
        usage_record=record,
        reservation_id=record.reservation_id if record.kind != UsageKind.ADJUSTMENT else None,
        kind=record.kind,
        tenant_id=record.tenant_id,
        customer_id=link.customer_id,
        event_name=_event_name(link.tenant),
        amount=_billable(record),
        currency=record.currency,
        occurred_at=record.created_at,
    )


def lines_resolve(queryset_filter: Q) -> int:
    """Fill in ``usage_record`` of rows written by settlement (named by reservation and kind)."""
    line = UsageRecord.objects.filter(reservation=OuterRef("reservation"), kind=OuterRef("kind"))
    return (
        BillingLine.objects.filter(queryset_filter, usage_record__isnull=True)
        .exclude(reservation__isnull=True)
        .update(usage_record=Subquery(line.values("pk")[:1]))
    )


def lines_without_row(tenant: Tenant) -> UsageRecordQuerySet:
    """The tenant's ledger lines that have no outbox row."""
    has_row = BillingLine.objects.filter(
        Q(usage_record=OuterRef("pk"))
        | Q(
            reservation=OuterRef("reservation"),
            kind=OuterRef("kind"),
            usage_record__isnull=True,
        )
    )
    return UsageRecord.objects.filter(tenant=tenant).exclude(Exists(has_row))


def outbox_catch_up(*, tenant: Tenant, now: datetime, since: datetime | None = None) -> int:
    """Add the outbox rows of the tenant's ledger lines that have none (booked while it was not
    linked, or committed while it was being linked), for its active link, booked since
    ``since`` (default: the start of Stripe's 35-day window). Returns how many rows it added."""
    link = StripeCustomerLink.objects.filter(tenant=tenant, unlinked_at__isnull=True).first()
    if link is None:
        return 0
    lines_resolve(Q(tenant=tenant))
    missing = lines_without_row(tenant).filter(created_at__gte=since or now - STRIPE_WINDOW)
    event_name = _event_name(tenant)
    records = list(missing.order_by("created_at", "pk"))
    queued = frozenset(record.pk for record in records)
    rows = [
        BillingLine(
            usage_record=record,
            reservation_id=record.reservation_id if record.kind != UsageKind.ADJUSTMENT else None,
            kind=record.kind,
            tenant=tenant,
            customer_id=link.customer_id,
            event_name=event_name,
            amount=_billable(record, queued),
            currency=record.currency,
            occurred_at=record.created_at,
        )
        for record in records
    ]
    BillingLine.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)
