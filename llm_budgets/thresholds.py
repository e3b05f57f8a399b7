"""Warning thresholds: detect that a budget's spent + reserved reached a percentage of its limit,
and email the tenant's billing contacts exactly once per (budget, period, threshold).

Detection is a cheap periodic scan of the counters of current periods (``thresholds_scan``),
never part of admission: a crossing is noticed within one scan interval. The unique constraint on
``ThresholdCrossing`` makes detection happen once however many workers scan; a new period has
new keys, which re-arms every threshold.

Delivery (``threshold_warning_send``) claims the row with a conditional UPDATE before sending and
records the result after. A crash between the send and the record leaves the claim behind; once it
is older than ``WARNING_CLAIM_TIMEOUT_SECONDS`` the row is due again and
``WARNING_DELIVERY`` decides: ``"at_least_once"`` (default) sends again, with the same
Message-ID so mail clients can fold the duplicate; ``"at_most_once"`` marks it abandoned.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.template.loader import render_to_string
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.models import Budget, Counter, DeliveryState, Plan, Scope, ThresholdCrossing
from llm_budgets.signals import threshold_crossed
from llm_budgets.windows import LIFETIME_START, period_for

logger = logging.getLogger("llm_budgets")

# Counters older than this cannot be in a current period (longest calendar period: a month).
_LONGEST_PERIOD = timedelta(days=32)


def budget_thresholds(budget: Budget) -> list[int]:
    """The budget's own thresholds, else its tenant's plan's, else the setting; ascending."""
    if budget.warning_thresholds is not None:
        return sorted(budget.warning_thresholds)
    plan = budget.tenant.plan if budget.tenant_id and budget.tenant else None
    if plan is not None and plan.warning_thresholds is not None:
        return sorted(plan.warning_thresholds)
    return sorted(conf.WARNING_THRESHOLDS)


def _current_period_start(budget: Budget, at: datetime) -> datetime:
    if budget.scope == Scope.GLOBAL or budget.tenant is None:
        return period_for(budget.window, at).start
    return period_for(
        budget.window, at, timezone=budget.tenant.timezone, billing_day=budget.tenant.billing_day
    ).start


@dataclass(frozen=True)
class _Crossed:
    counter: Counter
    thresholds: list[int]


def _lowest_threshold() -> int | None:
    """The lowest threshold any budget can have (None: warnings are off everywhere)."""
    configured: list[Any] = [conf.WARNING_THRESHOLDS]
    configured += Plan.objects.filter(warning_thresholds__isnull=False).values_list(
        "warning_thresholds", flat=True
    )
    configured += (
        Budget.objects.filter(warning_thresholds__isnull=False)
        .values_list("warning_thresholds", flat=True)
        .distinct()
    )
    return min((p for thresholds in configured for p in thresholds or ()), default=None)


def _crossed(now: datetime) -> list[_Crossed]:
    """Counters of current periods with at least one threshold reached (known or not)."""
    lowest = _lowest_threshold()
    if lowest is None:
        return []
    candidates = (
        Counter.objects.select_related("budget__tenant__plan")
        .filter(Q(period_start__gte=now - _LONGEST_PERIOD) | Q(period_start=LIFETIME_START))
        .filter(budget__limit__gt=0, period_start__lte=now)
        # Skip, in SQL, counters below the lowest threshold anywhere.
        .filter(spent__gte=F("budget__limit") * lowest / 100 - F("reserved"))
    )
    found = []
    for counter in candidates:
        budget = counter.budget
        if counter.period_start != _current_period_start(budget, now):
            continue
        used = counter.spent + counter.reserved
        reached = [t for t in budget_thresholds(budget) if used * 100 >= budget.limit * t]
        if reached:
            found.append(_Crossed(counter, reached))
    return found


def thresholds_scan(*, now: datetime | None = None) -> list[int]:
    """Record every threshold newly reached in a current period. Returns the new crossings' ids.

    When several thresholds of one budget are reached in the same scan, only the highest is
    emailed; the lower ones are recorded as skipped (and still signalled)."""
    now = now or timezone.now()
    created: list[ThresholdCrossing] = []
    crossed = _crossed(now)
    if not crossed:
        return []
    known = set(
        ThresholdCrossing.objects.filter(
            budget__in=[c.counter.budget_id for c in crossed],
            period_start__in={c.counter.period_start for c in crossed},
        ).values_list("budget_id", "period_start", "threshold")
    )
    with transaction.atomic():
        for item in crossed:
            counter, budget = item.counter, item.counter.budget
            new = [t for t in item.thresholds if (budget.pk, counter.period_start, t) not in known]
            for threshold in new:
                superseded = threshold != new[-1]
                try:
                    with transaction.atomic():
                        created.append(
                            ThresholdCrossing.objects.create(
                                budget=budget,
                                tenant=budget.tenant,
                                period_start=counter.period_start,
                                threshold=threshold,
                                limit=budget.limit,
                                spent=counter.spent,
                                reserved=counter.reserved,
                                currency=budget.currency,
                                crossed_at=now,
                                state=DeliveryState.SKIPPED
                                if superseded
                                else DeliveryState.PENDING,
                                last_error=f"superseded by {new[-1]}%" if superseded else "",
                            )
                        )
                except IntegrityError:
                    continue  # another scanner recorded it first: it owns the signal and email
        transaction.on_commit(lambda: _signal(created))
    return [c.pk for c in created]


def _signal(crossings: list[ThresholdCrossing]) -> None:
    for crossing in crossings:
        for receiver, result in threshold_crossed.send_robust(
            sender=ThresholdCrossing,
            crossing=crossing,
            budget=crossing.budget,
            threshold=crossing.threshold,
            period_start=crossing.period_start,
            spent=crossing.spent,
            reserved=crossing.reserved,
            limit=crossing.limit,
            currency=crossing.currency,
        ):
            if isinstance(result, Exception):
                logger.error(
                    "llm_budgets: threshold_crossed receiver %r failed: %s", receiver, result
                )


def thresholds_due(*, now: datetime | None = None) -> list[int]:
    """Crossings whose email is due: never claimed, or claimed by a sender presumed crashed."""
    now = now or timezone.now()
    return list(
        ThresholdCrossing.objects.filter(_claimable() | _stale(now))
        .order_by("crossed_at")
        .values_list("pk", flat=True)
    )


def _claimable() -> Q:
    return Q(state=DeliveryState.PENDING)


def _stale(now: datetime) -> Q:
    cutoff = now - timedelta(seconds=conf.WARNING_CLAIM_TIMEOUT_SECONDS)
    return Q(state=DeliveryState.SENDING, claimed_at__lt=cutoff)


def threshold_warning_send(crossing_id: int, *, now: datetime | None = None) -> str:
    """Email one crossing's warning to its tenant's billing contacts, unless another worker has
    it or it went out already. Returns the crossing's state afterwards.

    A send failure puts the row back to pending (at-least-once; the exception propagates so a
    task can retry) or abandons it (at-most-once)."""
    now = now or timezone.now()
    token = uuid.uuid4().hex
    rows = ThresholdCrossing.objects.filter(pk=crossing_id)
    if conf.WARNING_DELIVERY == "at_most_once":
        abandoned = rows.filter(_stale(now)).update(
            state=DeliveryState.ABANDONED,
            last_error="claim expired: the sender may have crashed before or after sending",
        )
        if abandoned:
            logger.warning("llm_budgets: warning %s abandoned (at-most-once).", crossing_id)
        claim = _claimable()
    else:
        claim = _claimable() | _stale(now)
    # The claim: only one worker's conditional UPDATE matches.
    if not rows.filter(claim).update(
        state=DeliveryState.SENDING, claimed_at=now, claim_token=token, attempts=F("attempts") + 1
    ):
        return str(rows.values_list("state", flat=True).first() or "missing")
    crossing = ThresholdCrossing.objects.select_related("budget", "tenant").get(pk=crossing_id)
    mine = rows.filter(claim_token=token, state=DeliveryState.SENDING)
    recipients = crossing.tenant.billing_contacts if crossing.tenant else []
    if not recipients:
        mine.update(state=DeliveryState.SKIPPED, last_error="no billing contacts")
        return DeliveryState.SKIPPED
    try:
        _message(crossing, recipients).send()
    except Exception as exc:
        failed = (
            DeliveryState.ABANDONED
            if conf.WARNING_DELIVERY == "at_most_once"
            else DeliveryState.PENDING
        )
        mine.update(state=failed, last_error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    # A crash here re-sends after the claim timeout (at-least-once) or abandons (at-most-once).
    if not mine.update(
        state=DeliveryState.SENT, sent_at=timezone.now(), recipients=", ".join(recipients)
    ):
        logger.warning("llm_budgets: warning %s was re-claimed while sending.", crossing_id)
    return DeliveryState.SENT


def _message(crossing: ThresholdCrossing, recipients: list[str]) -> EmailMultiAlternatives:
    budget = crossing.budget
    used = crossing.spent + crossing.reserved
    sender = conf.WARNING_FROM_EMAIL
    domain = sender.rpartition("@")[2].rstrip(">") or "localhost"
    context = {
        "crossing": crossing,
        "tenant": crossing.tenant,
        "budget": budget,
        "scope": budget.scope_label,
        "window": budget.get_window_display(),
        "threshold": crossing.threshold,
        "limit": crossing.limit,
        "spent": crossing.spent,
        "reserved": crossing.reserved,
        "used": used,
        "remaining": max(Decimal(0), crossing.limit - used),
        "currency": crossing.currency,
        "period_start": crossing.period_start,
    }
    subject = " ".join(
        render_to_string("llm_budgets/email/threshold_warning_subject.txt", context).split()
    )
    message = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string("llm_budgets/email/threshold_warning.txt", context),
        from_email=sender,
        to=recipients,
        # Stable across re-sends, so a duplicate (at-least-once) is recognisable.
        headers={"Message-ID": f"<llm-budgets.warning.{crossing.pk}@{domain}>"},
    )
    message.attach_alternative(
        render_to_string("llm_budgets/email/threshold_warning.html", context), "text/html"
    )
    return message
