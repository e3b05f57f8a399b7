"""Reads of billing state, for the admin and the tenant pages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, Sum

from llm_budgets.models import (
    BillingLine,
    MeterDelivery,
    MeterDeliveryState,
    ReconciliationRun,
    StripeCustomerLink,
    StripeInvoice,
    Tenant,
)
from llm_budgets.money import MILLION, ZERO


def billed_so_far(tenant: Tenant, start: datetime, end: datetime) -> Decimal | None:
    """``billed_in_period`` for a tenant that has ever had usage delivered to Stripe; None for
    one that has not (the tenant pages then show no billed figure rather than a zero)."""
    if not MeterDelivery.objects.filter(tenant=tenant).exists():
        return None
    return billed_in_period(tenant, start, end)


def billed_in_period(tenant: Tenant, start: datetime, end: datetime) -> Decimal:
    """What Stripe has accepted for ``tenant`` with event timestamps in [start, end), in the
    currency unit (units / 1,000,000): "billed so far this period". Cancels and corrections
    count; usage waiting in the outbox does not."""
    units = MeterDelivery.objects.filter(
        tenant=tenant,
        state=MeterDeliveryState.SENT,
        timestamp__gte=start,
        timestamp__lt=end,
    ).aggregate(units=Sum("units"))["units"]
    return Decimal(units or 0) / MILLION


def unpaid_invoices(tenant_id: int) -> list[str]:
    """The invoices whose failed payment the tenant's payment switch waits on (oldest first)."""
    return list(
        StripeInvoice.objects.filter(
            tenant_id=tenant_id, payment_failed_at__isnull=False, settled_at__isnull=True
        )
        .order_by("payment_failed_at", "invoice_id")
        .values_list("invoice_id", flat=True)
    )


@dataclass(frozen=True)
class BillingStatus:
    link: StripeCustomerLink | None
    unbuilt_amount: Decimal  # outbox rows not yet in a delivery (the current hour, or waiting)
    unbuilt_lines: int
    by_state: dict[str, tuple[int, Decimal]]  # delivery state -> (count, units / 1e6)
    last_reconciliation: ReconciliationRun | None
    unpaid_invoices: list[str]  # what the tenant's payment switch waits on


def billing_status(tenant: Tenant) -> BillingStatus:
    """A tenant's Stripe link, what waits, what was sent, parked, too old; the last run."""
    link = StripeCustomerLink.objects.filter(tenant=tenant).first()
    unbuilt = BillingLine.objects.filter(tenant=tenant, delivery__isnull=True).aggregate(
        amount=Sum("amount"), lines=Count("pk")
    )
    states = {
        row["state"]: (row["n"], Decimal(row["units"] or 0) / MILLION)
        for row in MeterDelivery.objects.filter(tenant=tenant)
        .values("state")
        .annotate(n=Count("pk"), units=Sum("units"))
    }
    return BillingStatus(
        link=link,
        unbuilt_amount=unbuilt["amount"] or ZERO,
        unbuilt_lines=unbuilt["lines"] or 0,
        by_state=states,
        last_reconciliation=ReconciliationRun.objects.order_by("-started_at").first(),
        # Only a stopped tenant has any to show (no query otherwise).
        unpaid_invoices=unpaid_invoices(tenant.pk) if link and link.payment_switch_id else [],
    )
