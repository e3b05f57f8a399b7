"""Reconciliation: per customer and hour, what our sent deliveries add up to against Stripe's
meter event summaries. Differences are recorded (admin) and announced
(``signals.stripe_reconciled``); a clean run says so."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from llm_budgets import signals
from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.stripe_push import HOUR, hour_of
from llm_budgets.conf import conf
from llm_budgets.models import (
    DeliveryKind,
    MeterDelivery,
    MeterDeliveryState,
    ReconciliationDifference,
    ReconciliationRun,
    StripeMeter,
)

Key = tuple[str, str, datetime]


def delivered_by_hour(start: datetime, end: datetime) -> tuple[dict[Key, int], dict[str, int]]:
    """Units our sent deliveries put in each (customer, meter, hour) of [start, end), and the
    tenant of each customer."""
    expected: dict[Key, int] = defaultdict(int)
    tenants: dict[str, int] = {}
    sent = MeterDelivery.objects.filter(
        state=MeterDeliveryState.SENT, timestamp__gte=start, timestamp__lt=end
    ).select_related("cancels")
    for d in sent:
        if d.kind == DeliveryKind.CANCEL and d.cancels is not None:
            stamp = d.cancels.timestamp
        else:
            stamp = d.timestamp
        expected[(d.customer_id, d.event_name, hour_of(stamp))] += d.units
        tenants[d.customer_id] = d.tenant_id
    return expected, tenants


def billing_reconcile(
    *,
    now: datetime | None = None,
    days: int | None = None,
    customer_ids: Collection[str] | None = None,
) -> ReconciliationRun:
    """Compare the last ``days`` (default ``STRIPE_RECONCILE_DAYS``) of closed hours, up to the
    hour before the current one (Stripe's summaries lag), for every customer delivered to (or
    only ``customer_ids``)."""
    now = now or timezone.now()
    end = hour_of(now) - HOUR
    start = end - timedelta(days=days or conf.STRIPE_RECONCILE_DAYS)
    run = ReconciliationRun.objects.create(started_at=now, window_start=start, window_end=end)
    expected, tenants = delivered_by_hour(start, end)
    meters = dict(StripeMeter.objects.values_list("event_name", "meter_id"))
    pairs = sorted({(c, e) for c, e, _ in expected if customer_ids is None or c in customer_ids})
    diffs: list[ReconciliationDifference] = []
    try:
        client = stripe_client()
        for customer, event in pairs:
            meter = meters.get(event)
            if meter is None:
                raise LookupError(
                    f"No meter id is known for event name {event!r}: run "
                    "manage.py llm_budgets_stripe_setup."
                )
            reported: dict[datetime, int] = defaultdict(int)
            summaries = client.v1.billing.meters.event_summaries.list(
                meter,
                params={
                    "customer": customer,
                    "start_time": int(start.timestamp()),
                    "end_time": int(end.timestamp()),
                    "value_grouping_window": "hour",
                    "limit": 100,
                },
            )
            for summary in summaries.auto_paging_iter():
                hour = datetime.fromtimestamp(summary.start_time, tz=start.tzinfo)
                reported[hour] += int(Decimal(str(summary.aggregated_value)))
            hours = {h for c, e, h in expected if (c, e) == (customer, event)} | set(reported)
            for hour in sorted(hours):
                ours = expected.get((customer, event, hour), 0)
                theirs = reported.get(hour, 0)
                run.hours_checked += 1
                if ours != theirs:
                    diffs.append(
                        ReconciliationDifference(
                            run=run,
                            tenant_id=tenants.get(customer),
                            customer_id=customer,
                            event_name=event,
                            hour=hour,
                            delivered_units=ours,
                            stripe_units=theirs,
                        )
                    )
    except Exception as exc:  # recorded on the run and shown in the admin
        run.error = f"{type(exc).__name__}: {exc}"
    with transaction.atomic():
        ReconciliationDifference.objects.bulk_create(diffs)
        run.customers = len({c for c, _ in pairs})
        run.differences = len(diffs)
        run.finished_at = timezone.now()
        run.save()
        transaction.on_commit(
            lambda: signals.stripe_reconciled.send_robust(
                sender=ReconciliationRun, run=run, differences=diffs
            )
        )
    return run
