"""Link a tenant to a Stripe customer, and unlink it. Both audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from llm_budgets.billing.outbox import (
    STRIPE_WINDOW,
    lines_without_row,
    linked_cache_clear,
    outbox_catch_up,
)
from llm_budgets.billing.stripe_push import to_units
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    AuditEvent,
    BillingLine,
    MeterDelivery,
    MeterDeliveryState,
    StripeCustomerLink,
    Tenant,
)
from llm_budgets.money import ZERO
from llm_budgets.tenancy.tenants import tenant_get


def _customer_id(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("cus_") or len(value) > 255:
        raise InvalidUsage(
            f"customer_id must be a Stripe customer id such as 'cus_ABC123', got {value!r}.",
            field="customer_id",
        )
    return value


def _tenant(tenant: Tenant | str) -> Tenant:
    return tenant if isinstance(tenant, Tenant) else tenant_get(tenant)


def stripe_customer_link(
    *, tenant: Tenant | str, customer_id: object, actor: str = "", now: datetime | None = None
) -> StripeCustomerLink:
    """Link (or relink) ``tenant`` to a Stripe customer. The tenant's unsent usage of the last 35
    days goes to this customer (older usage is reported as too old, never sent with a wrong
    timestamp); usage already sent stays where it went."""
    customer = _customer_id(customer_id)
    now = now or timezone.now()
    with transaction.atomic():
        row = _tenant(tenant)
        link = StripeCustomerLink.objects.select_for_update().filter(tenant=row).first()
        before = None
        if link is None:
            link = StripeCustomerLink(tenant=row)
        else:
            before = {"customer_id": link.customer_id, "active": link.active}
        link.customer_id = customer
        link.linked_at = now
        link.linked_by = actor
        link.unlinked_at = None
        link.caught_up_at = None
        link.unlink_reason = ""
        link.save()
        linked_cache_clear()
        transaction.on_commit(linked_cache_clear)
        # Unsent rows follow the tenant to its current customer.
        moved = BillingLine.objects.filter(tenant=row, delivery__isnull=True).update(
            customer_id=customer
        )
        added = outbox_catch_up(tenant=row, now=now)
        too_old = _report_too_old(row, customer, now)
        AuditEvent.objects.create(
            action="stripe.link",
            actor=actor,
            tenant=row,
            target=f"tenant {row.external_id}",
            before=before,
            after={
                "customer_id": customer,
                "unsent_lines_moved": moved,
                "lines_queued": added,
                "too_old_amount": str(too_old),
            },
            reason="linked to a Stripe customer",
        )
    return link


def _report_too_old(tenant: Tenant, customer: str, now: datetime) -> object:
    """Usage older than Stripe's window that was never queued: recorded once as a TOO_OLD
    delivery (shown to staff), never sent."""
    old = lines_without_row(tenant).spend().filter(created_at__lt=now - STRIPE_WINDOW)
    total = old.aggregate(total=Sum("customer_cost"))["total"] or ZERO
    count = old.count()
    if not count:
        return ZERO
    MeterDelivery.objects.create(
        tenant=tenant,
        customer_id=customer,
        event_name="",
        hour=now.replace(minute=0, second=0, microsecond=0),
        timestamp=now,
        identifier=f"llmb-too-old-{tenant.pk}-{int(now.timestamp() * 1000)}",
        amount=total,
        units=to_units(total),
        currency=conf.CURRENCY,
        state=MeterDeliveryState.TOO_OLD,
        next_attempt_at=now,
        note=f"{count} ledger line(s) booked more than 35 days before linking: not sent",
        created_at=now,
    )
    return total


def stripe_customer_unlink(
    *, tenant: Tenant | str, reason: str = "", actor: str = "", now: datetime | None = None
) -> StripeCustomerLink:
    """Stop delivering the tenant's new usage. Rows already in the outbox stay owed: they are
    delivered to the customer they were booked for (or wait, and follow a relink)."""
    now = now or timezone.now()
    with transaction.atomic():
        row = _tenant(tenant)
        link = StripeCustomerLink.objects.select_for_update().filter(tenant=row).first()
        if link is None or not link.active:
            raise InvalidUsage(
                f"Tenant {row.external_id!r} is not linked to a Stripe customer.", field="tenant"
            )
        link.unlinked_at = now
        link.unlink_reason = (reason or "unlinked")[:255]
        link.save(update_fields=["unlinked_at", "unlink_reason"])
        linked_cache_clear()
        transaction.on_commit(linked_cache_clear)
        AuditEvent.objects.create(
            action="stripe.unlink",
            actor=actor,
            tenant=row,
            target=f"tenant {row.external_id}",
            before={"customer_id": link.customer_id},
            after={"active": False},
            reason=link.unlink_reason,
        )
    return link
