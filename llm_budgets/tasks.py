"""Celery tasks (needs the ``celery`` extra). Each one only calls a service, or fetches by id and
calls a service; the schedule is in :mod:`llm_budgets.schedule`. Every job also exists as a
management command, for hosts that run cron instead (docs/operations.md).
"""

from __future__ import annotations

import logging
from functools import partial

from celery import shared_task
from django.db import transaction

from llm_budgets.engine import settlement
from llm_budgets.jobs import anomalies, retention, rollups, thresholds
from llm_budgets.jobs.records import job_recorded

logger = logging.getLogger(__name__)

# Every job is idempotent (a sweep, a scan or a push run twice changes nothing the first did not),
# so each is acknowledged only once it has finished: a worker killed mid-task (SIGKILL, OOM, a
# lost host) leaves the message to be delivered again (with Redis, after the broker's visibility
# timeout) instead of losing the run. A task that failed with an exception is not redelivered.
JOB = {"ignore_result": True, "acks_late": True, "reject_on_worker_lost": True}


@shared_task(name="llm_budgets.sweep_expired_holds", **JOB)
@job_recorded("llm_budgets.sweep_expired_holds")
def sweep_expired_holds() -> int:
    return settlement.reservations_sweep()


@shared_task(name="llm_budgets.reconcile_uncertain", **JOB)
@job_recorded("llm_budgets.reconcile_uncertain")
def reconcile_uncertain() -> int:
    return settlement.reservations_reconcile()


@shared_task(name="llm_budgets.scan_thresholds", **JOB)
@job_recorded("llm_budgets.scan_thresholds")
def scan_thresholds() -> int:
    """Record new crossings, then enqueue one email task for each crossing that is due (new ones
    and any left behind by a crashed sender), once the rows are committed."""
    created = thresholds.thresholds_scan()
    for crossing_id in thresholds.thresholds_due():
        transaction.on_commit(partial(send_threshold_warning.delay, crossing_id))
    return len(created)


@shared_task(
    name="llm_budgets.send_threshold_warning",
    **JOB,
    autoretry_for=(OSError,),
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=8,
)
def send_threshold_warning(crossing_id: int) -> str:
    return thresholds.threshold_warning_send(crossing_id)


@shared_task(name="llm_budgets.detect_anomalies", **JOB)
@job_recorded("llm_budgets.detect_anomalies")
def detect_anomalies() -> int:
    """Automatic kill switches: spend velocity, runaway loops, failure storms (per plan)."""
    return len(anomalies.anomalies_detect())


@shared_task(name="llm_budgets.rollup_daily_usage", **JOB)
@job_recorded("llm_budgets.rollup_daily_usage")
def rollup_daily_usage() -> int:
    return rollups.daily_usage_refresh()


@shared_task(name="llm_budgets.purge_retention", **JOB)
@job_recorded("llm_budgets.purge_retention")
def purge_retention() -> int:
    return retention.reservations_purge() + retention.refusals_purge()


@shared_task(name="llm_budgets.stripe_push", **JOB)
@job_recorded("llm_budgets.stripe_push")
def stripe_push() -> int:
    """Deliver pending usage to Stripe (nothing without STRIPE_API_KEY: usage waits)."""
    from llm_budgets.billing.client import StripeNotConfigured
    from llm_budgets.billing.delivery import billing_push

    try:
        return billing_push().sent
    except StripeNotConfigured:
        return 0


@shared_task(name="llm_budgets.stripe_reconcile", **JOB)
@job_recorded("llm_budgets.stripe_reconcile")
def stripe_reconcile() -> int:
    """Compare delivered usage with Stripe's summaries; returns the number of differences."""
    from llm_budgets.billing.reconciliation import billing_reconcile
    from llm_budgets.conf import conf

    if not conf.STRIPE_API_KEY:
        return 0  # nothing was sent, so nothing to compare
    return billing_reconcile().differences


@shared_task(name="llm_budgets.credits_daily", **JOB)
@job_recorded("llm_budgets.credits_daily")
def credits_daily() -> int:
    """Expire due credit lots, bring the Stripe grants of lots whose live part changed into
    step, then reconcile prepaid balances with Stripe; returns the number of differences (each
    logged)."""
    from llm_budgets.billing.credit_reconciliation import credits_reconcile
    from llm_budgets.billing.credits import credits_expire
    from llm_budgets.billing.topups import grants_follow
    from llm_budgets.conf import conf

    credits_expire()
    if not conf.STRIPE_API_KEY:
        return 0
    grants_follow()
    differences = 0
    for report in credits_reconcile():
        for difference in report.differences:
            logger.warning("prepaid balance of %s: %s", report.tenant, difference)
        differences += len(report.differences)
    return differences


@shared_task(name="llm_budgets.recharges_send", **JOB)
@job_recorded("llm_budgets.recharges_send")
def recharges_send() -> int:
    """Pay pending auto-recharges off-session; returns how many were credited."""
    from llm_budgets.billing.recharge import recharges_send as send
    from llm_budgets.conf import conf

    if not conf.STRIPE_API_KEY:
        return 0
    return send()["credited"]


@shared_task(name="llm_budgets.deliver_alerts", **JOB)
@job_recorded("llm_budgets.deliver_alerts")
def deliver_alerts() -> int:
    """Send the alert deliveries that are due (each endpoint's in order); returns how many went."""
    from llm_budgets.alerts.delivery import alerts_deliver

    return alerts_deliver().delivered
