"""Celery tasks (needs the ``celery`` extra). Each one only calls a service, or fetches by id and
calls a service; each periodic one is the task of a job declared in :mod:`llm_budgets.schedule`,
named from it (``job_task``). Every job also exists as a management command, for hosts that run
cron instead (docs/operations.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from celery import shared_task
from django.db import transaction

from llm_budgets.engine import settlement
from llm_budgets.jobs import anomalies, retention, rollups, thresholds
from llm_budgets.jobs.records import job_recorded
from llm_budgets.schedule import (
    CREDITS_DAILY,
    DELIVER_ALERTS,
    DETECT_ANOMALIES,
    PURGE_RETENTION,
    RECHARGES_SEND,
    RECONCILE_UNCERTAIN,
    ROLLUP_DAILY_USAGE,
    SCAN_THRESHOLDS,
    STRIPE_PUSH,
    STRIPE_RECONCILE,
    SWEEP_EXPIRED_HOLDS,
    Job,
)

logger = logging.getLogger(__name__)

# Every job is idempotent (a sweep, a scan or a push run twice changes nothing the first did not),
# so each is acknowledged only once it has finished: a worker killed mid-task (SIGKILL, OOM, a
# lost host) leaves the message to be delivered again (with Redis, after the broker's visibility
# timeout) instead of losing the run. A task that failed with an exception is not redelivered.
JOB = {"ignore_result": True, "acks_late": True, "reject_on_worker_lost": True}


def job_task(job: Job) -> Callable[[Callable[[], int]], Any]:
    """Make the decorated function the Celery task of ``job``: named ``job.task``, acknowledged
    late (``JOB``), and each of its runs recorded for ``/health`` (``job_recorded``)."""

    def decorate(function: Callable[[], int]) -> Any:
        return shared_task(name=job.task, **JOB)(job_recorded(job.task)(function))

    return decorate


@job_task(SWEEP_EXPIRED_HOLDS)
def sweep_expired_holds() -> int:
    return settlement.reservations_sweep()


@job_task(RECONCILE_UNCERTAIN)
def reconcile_uncertain() -> int:
    return settlement.reservations_reconcile()


@job_task(SCAN_THRESHOLDS)
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


@job_task(DETECT_ANOMALIES)
def detect_anomalies() -> int:
    """Automatic kill switches: spend velocity, runaway loops, failure storms (per plan)."""
    return len(anomalies.anomalies_detect())


@job_task(ROLLUP_DAILY_USAGE)
def rollup_daily_usage() -> int:
    return rollups.daily_usage_refresh()


@job_task(PURGE_RETENTION)
def purge_retention() -> int:
    return retention.reservations_purge() + retention.refusals_purge()


@job_task(STRIPE_PUSH)
def stripe_push() -> int:
    """Deliver pending usage to Stripe (nothing without STRIPE_API_KEY: usage waits)."""
    from llm_budgets.billing import stripe_push as job
    from llm_budgets.billing.client import StripeNotConfigured

    try:
        return job.stripe_push().sent
    except StripeNotConfigured:
        return 0


@job_task(STRIPE_RECONCILE)
def stripe_reconcile() -> int:
    """Compare delivered usage with Stripe's summaries; returns the number of differences."""
    from llm_budgets.billing.reconciliation import billing_reconcile
    from llm_budgets.conf import conf

    if not conf.STRIPE_API_KEY:
        return 0  # nothing was sent, so nothing to compare
    return billing_reconcile().differences


@job_task(CREDITS_DAILY)
def credits_daily() -> int:
    """Expire due credit lots, bring Stripe's grants into step and reconcile the prepaid balances
    (``billing.credits_daily``); returns the number of differences (each logged)."""
    from llm_budgets.billing.credits_daily import credits_daily as run_daily

    differences = 0
    for report in run_daily():
        for difference in report.differences:
            logger.warning("prepaid balance of %s: %s", report.tenant, difference)
        differences += len(report.differences)
    return differences


@job_task(RECHARGES_SEND)
def recharges_send() -> int:
    """Pay pending auto-recharges off-session; returns how many were credited."""
    from llm_budgets.billing.recharge import recharges_send as send

    return send()["credited"]


@job_task(DELIVER_ALERTS)
def deliver_alerts() -> int:
    """Send the alert deliveries that are due (each endpoint's in order); returns how many went."""
    from llm_budgets.alerts.delivery import alerts_deliver

    return alerts_deliver().delivered
