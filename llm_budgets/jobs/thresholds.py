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

from llm_budgets import hooks
from llm_budgets.alerts.endpoints import warning_recipients
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.db.boundary import ledger_transaction
from llm_budgets.engine.types import DIMENSIONS, ApplicableBudget
from llm_budgets.models import (
    ApiKey,
    Budget,
    Counter,
    CrossingKind,
    DeliveryState,
    EndUser,
    Plan,
    Run,
    Scope,
    ThresholdCrossing,
    Window,
)
from llm_budgets.money import money_field
from llm_budgets.reads.projections import with_projections
from llm_budgets.reads.statuses import statuses_for
from llm_budgets.signals import threshold_crossed
from llm_budgets.windows import (
    LIFETIME_START,
    MAX_ROLLING,
    ROLLING_PREFIX,
    Period,
    budget_period,
    rolling_window,
)

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


def _warning_period(budget: Budget, period: Period, at: datetime) -> datetime:
    """What a warning is sent once per: the calendar period; for a rolling window, each span of
    the window's length (aligned to the Unix epoch), so a rolling budget re-arms once per length."""
    window = rolling_window(budget.window)
    return period.start if window is None else window.span_start(at)


@dataclass(frozen=True)
class _Crossed:
    item: ApplicableBudget
    period_key: datetime
    spent: Decimal
    reserved: Decimal
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


def _candidates(now: datetime, lowest: int) -> list[ApplicableBudget]:
    """Counter series (budget, and the end user, run or key of a share) whose current usage may
    have reached a threshold.

    A calendar counter is the whole period: those below the lowest threshold are skipped in SQL.
    A rolling window sums many buckets, so any bucket with usage in the last year makes its budget
    a candidate; ``statuses_for`` then reads each candidate's window (one query for all)."""
    recent = Q(period_start__gte=now - _LONGEST_PERIOD) | Q(period_start=LIFETIME_START)
    live = Counter.objects.filter(budget__limit__gt=0, period_start__lte=now)
    # A hot budget's stripe holds a part of its use: any stripe with use makes it a candidate
    # (``statuses_for`` sums the stripes).
    calendar = (
        live.exclude(budget__window__startswith=ROLLING_PREFIX)
        .filter(recent)
        .filter(
            Q(spent__gte=F("budget__limit") * lowest / 100 - F("reserved"))
            | Q(budget__hot=True, spent__gt=0)
            | Q(budget__hot=True, reserved__gt=0)
        )
    )
    rolling = live.filter(
        budget__window__startswith=ROLLING_PREFIX,
        period_start__gte=now - MAX_ROLLING - _LONGEST_PERIOD,
    ).filter(Q(spent__gt=0) | Q(reserved__gt=0))
    # Each counter series (``CounterKey`` without its period): a budget, or one share of a
    # ``"*"`` budget (an end user's, a run's, an API key's).
    fields = ["budget_id", *(f"{d}_id" for d in DIMENSIONS)]
    series = set(calendar.values_list(*fields)) | set(rolling.values_list(*fields).distinct())
    budgets = Budget.objects.select_related("tenant__plan").in_bulk({s[0] for s in series})
    end_users = EndUser.objects.in_bulk({s[1] for s in series if s[1] is not None})
    runs = Run.objects.in_bulk({s[2] for s in series if s[2] is not None})
    keys = ApiKey.objects.in_bulk({s[3] for s in series if s[3] is not None})
    items = []
    for budget_id, end_user_id, run_id, key_id in sorted(
        series, key=lambda s: (s[0], s[1] or 0, s[2] or 0, s[3] or "")
    ):
        budget = budgets[budget_id]
        items.append(
            ApplicableBudget(
                budget,
                budget_period(budget, now),
                end_users[end_user_id] if end_user_id is not None else None,
                run=runs[run_id] if run_id is not None else None,
                api_key=keys[key_id] if key_id is not None else None,
            )
        )
    return items


def _crossed(now: datetime) -> list[_Crossed]:
    """Budgets (per end user for each-end-user budgets) whose current spent + reserved reached
    at least one of their thresholds (recorded already or not)."""
    lowest = _lowest_threshold()
    if lowest is None:
        return []
    items = _candidates(now, lowest)
    found = []
    for item, status in zip(items, statuses_for(items), strict=True):
        budget = item.budget
        used = status.spent + status.reserved
        reached = [t for t in budget_thresholds(budget) if used * 100 >= budget.limit * t]
        if reached:
            key = _warning_period(budget, item.period, now)
            found.append(_Crossed(item, key, status.spent, status.reserved, reached))
    return found


def thresholds_scan(*, now: datetime | None = None) -> list[int]:
    """Record every threshold newly reached in a current period. Returns the new crossings' ids.

    When several thresholds of one budget are reached in the same scan, only the highest is
    emailed; the lower ones are recorded as skipped (and still signalled)."""
    now = now or timezone.now()
    created: list[ThresholdCrossing] = []
    projected = _projected_crossings(now)
    crossed = _crossed(now)
    if not crossed:
        return projected
    known = set(
        ThresholdCrossing.objects.filter(
            budget__in=[c.item.budget.pk for c in crossed],
            period_start__in={c.period_key for c in crossed},
            # A projected warning (threshold 100 too) is another kind: it must not count as
            # the 100% crossing already sent.
            kind=CrossingKind.THRESHOLD,
        ).values_list(
            "budget_id", "end_user_id", "run_id", "api_key_id", "period_start", "threshold"
        )
    )
    with ledger_transaction():
        for item in crossed:
            budget, end_user = item.item.budget, item.item.end_user
            run, api_key = item.item.run, item.item.api_key
            share = (
                end_user.pk if end_user else None,
                run.pk if run else None,
                api_key.pk if api_key else None,
            )
            new = [
                t for t in item.thresholds if (budget.pk, *share, item.period_key, t) not in known
            ]
            for threshold in new:
                superseded = threshold != new[-1]
                _record(
                    created,
                    budget=budget,
                    tenant=budget.tenant,
                    end_user=end_user,
                    run=run,
                    api_key=api_key,
                    period_start=item.period_key,
                    threshold=threshold,
                    limit=budget.limit,
                    spent=item.spent,
                    reserved=item.reserved,
                    currency=budget.currency,
                    crossed_at=now,
                    state=DeliveryState.SKIPPED if superseded else DeliveryState.PENDING,
                    last_error=f"superseded by {new[-1]}%" if superseded else "",
                )
        transaction.on_commit(lambda: _signal(created))
    return projected + [c.pk for c in created]


def _projected_crossings(now: datetime) -> list[int]:
    """Plans that opted in (``Plan.warn_projected``): each of their tenants' own monthly budget
    that, at the recent burn rate (``reads.projections``), reaches its limit before it resets is
    recorded once per period (``kind="projected"``, threshold 100) and emailed like a threshold.
    Off by default; a budget already at its limit is the 100% threshold's business."""
    items = [
        ApplicableBudget(budget, budget_period(budget, now))
        for budget in Budget.objects.select_related("tenant__plan").filter(
            tenant__plan__warn_projected=True,
            scope=Scope.TENANT,
            window=Window.MONTH,
            limit__gt=0,
        )
    ]
    if not items:
        return []
    statuses = statuses_for(items)
    created: list[ThresholdCrossing] = []
    with ledger_transaction():
        for item, status in zip(items, statuses, strict=True):
            budget = item.budget
            assert budget.tenant is not None
            (status,) = with_projections([status], budget.tenant, None, now)
            if status.runs_out_at is None or status.projected is None:
                continue
            _record(
                created,
                budget=budget,
                tenant=budget.tenant,
                kind=CrossingKind.PROJECTED,
                period_start=item.period.start,
                threshold=100,
                limit=status.limit,
                spent=status.spent,
                reserved=status.reserved,
                projected=status.projected,
                runs_out_at=status.runs_out_at,
                currency=budget.currency,
                crossed_at=now,
            )
        transaction.on_commit(lambda: _signal(created))
    return [c.pk for c in created]


def _record(created: list[ThresholdCrossing], **fields: Any) -> None:
    """Record one crossing, once: a crossing another scanner (or this one, earlier) recorded
    first is left to it, with its signal and email (the unique constraints decide)."""
    try:
        with ledger_transaction():
            crossing = ThresholdCrossing.objects.create(**fields)
            # Its alert in the same savepoint: the event exists exactly when the crossing does.
            _alert(crossing)
            created.append(crossing)
    except IntegrityError:
        pass


def _alert(crossing: ThresholdCrossing) -> None:
    budget = crossing.budget
    common = {
        "budget_id": budget.pk,
        "scope": _scope_label(crossing),
        "window": budget.window,
        "tenant": crossing.tenant.external_id if crossing.tenant else None,
        "end_user": crossing.end_user.external_id if crossing.end_user else None,
        "limit": money_field(crossing.limit),
        "currency": crossing.currency,
        "period_start": time_field(crossing.period_start),
        "spent": money_field(crossing.spent),
        "reserved": money_field(crossing.reserved),
        "at": time_field(crossing.crossed_at),
    }
    if crossing.kind == CrossingKind.PROJECTED:
        assert crossing.projected is not None
        assert crossing.runs_out_at is not None
        hooks.event_record(
            "budget.projected_to_exceed",
            tenant=crossing.tenant,
            body={
                **common,
                "projected": money_field(crossing.projected),
                "runs_out_at": time_field(crossing.runs_out_at),
            },
        )
    else:
        hooks.event_record(
            "threshold.crossed",
            tenant=crossing.tenant,
            body={**common, "threshold": crossing.threshold},
        )


def _signal(crossings: list[ThresholdCrossing]) -> None:
    for crossing in crossings:
        for receiver, result in threshold_crossed.send_robust(
            sender=ThresholdCrossing,
            crossing=crossing,
            budget=crossing.budget,
            end_user=crossing.end_user,
            threshold=crossing.threshold,
            period_start=crossing.period_start,
            spent=crossing.spent,
            reserved=crossing.reserved,
            limit=crossing.limit,
            currency=crossing.currency,
            kind=crossing.kind,
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
    """Email one crossing's warning to its tenant's email endpoints that subscribe to it (the
    billing contacts' among them: ``alerts.endpoints.warning_recipients``), unless another
    worker has it or it went out already. Returns the crossing's state afterwards.

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
    crossing = ThresholdCrossing.objects.select_related(
        "budget", "tenant", "end_user", "run", "api_key"
    ).get(pk=crossing_id)
    mine = rows.filter(claim_token=token, state=DeliveryState.SENDING)
    event_type = (
        "budget.projected_to_exceed"
        if crossing.kind == CrossingKind.PROJECTED
        else "threshold.crossed"
    )
    recipients = warning_recipients(crossing.tenant, event_type) if crossing.tenant else []
    if not recipients:
        mine.update(
            state=DeliveryState.SKIPPED,
            last_error=f"no email endpoint of the tenant subscribes to {event_type} "
            "(its billing contacts: ensure_tenant(billing_emails=...))",
        )
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


def _scope_label(crossing: ThresholdCrossing) -> str:
    if crossing.run is not None and crossing.tenant is not None:
        return f"run {crossing.run.external_id} of {crossing.tenant.external_id}"
    if crossing.api_key is not None:
        return f"API key {crossing.api_key.prefix}"
    if crossing.end_user is not None and crossing.tenant is not None:
        return f"end user {crossing.tenant.external_id}/{crossing.end_user.external_id}"
    return crossing.budget.scope_label


def _message(crossing: ThresholdCrossing, recipients: list[str]) -> EmailMultiAlternatives:
    budget = crossing.budget
    used = crossing.spent + crossing.reserved
    sender = conf.WARNING_FROM_EMAIL
    domain = sender.rpartition("@")[2].rstrip(">") or "localhost"
    context = {
        "crossing": crossing,
        "tenant": crossing.tenant,
        "budget": budget,
        "scope": _scope_label(crossing),
        "window": budget.window.replace(ROLLING_PREFIX, "rolling "),
        "threshold": crossing.threshold,
        "projected_warning": crossing.kind == CrossingKind.PROJECTED,
        "projected": crossing.projected,
        "runs_out_at": crossing.runs_out_at,
        "limit": crossing.limit,
        "spent": crossing.spent,
        "reserved": crossing.reserved,
        "used": used,
        "remaining": max(Decimal(0), crossing.limit - used),
        "currency": crossing.currency,
        "period_start": crossing.period_start,
        # Times in the tenant's timezone, labelled (llm_budgets.clock); money in the one format.
        "timezone": crossing.tenant.timezone if crossing.tenant else None,
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
