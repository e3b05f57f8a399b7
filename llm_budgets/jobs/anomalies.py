"""Anomaly detection that trips kill switches by itself, with thresholds set per plan.

Three detectors, each off until its plan sets a threshold:

- **spend velocity**: a tenant (``anomaly_tenant_spend``) or an end user
  (``anomaly_end_user_spend``) spending more than that within ``anomaly_window_minutes``.
  Spend counts ledger lines written in the window plus holds taken in it and still held.
- **runaway loop**: an end user taking more than ``anomaly_reservations_per_minute``
  reservations in the last minute.
- **failure storm**: a tenant whose holds settled in the window were released or expired more
  than ``anomaly_failure_share`` of the time (with at least ``anomaly_failure_min_holds``).

An automatic trip stays until a person clears it, unless the plan sets
``anomaly_auto_clear_minutes`` (the switch then carries ``auto_clear_at``). After a person clears a
scope, the detectors leave it alone for one window, so old data cannot re-trip it at once.
Run ``manage.py llm_budgets_detect_anomalies`` from cron or Celery beat.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from llm_budgets.control.killswitches import SwitchScope, kill_switch_trip, switch_open_q
from llm_budgets.models import (
    EndUser,
    KillSwitch,
    Plan,
    Reservation,
    ReservationState,
    Tenant,
    UsageRecord,
)
from llm_budgets.money import ZERO, display, round_charge

VELOCITY = "spend_velocity"
RUNAWAY = "runaway_loop"
FAILURES = "failure_storm"


@dataclass(frozen=True)
class Finding:
    detector: str
    tenant_id: int
    end_user_id: int | None
    reason: str


def anomalies_detect(*, now: datetime | None = None) -> list[KillSwitch]:
    """Run every detector for every plan that configures one; trip a switch per finding whose
    scope is not already tripped (or cleared by a person within the window). Returns the new
    switches."""
    now = now or timezone.now()
    tripped: list[KillSwitch] = []
    plans = Plan.objects.filter(
        Q(anomaly_tenant_spend__isnull=False)
        | Q(anomaly_end_user_spend__isnull=False)
        | Q(anomaly_reservations_per_minute__isnull=False)
        | Q(anomaly_failure_share__isnull=False)
    )
    for plan in plans:
        since = now - timedelta(minutes=plan.anomaly_window_minutes)
        auto_clear_at = (
            now + timedelta(minutes=plan.anomaly_auto_clear_minutes)
            if plan.anomaly_auto_clear_minutes
            else None
        )
        seen: set[tuple[int, int | None]] = set()
        for finding in _findings(plan, since=since, now=now):
            key = (finding.tenant_id, finding.end_user_id)
            if key in seen or _left_alone(key, since=since, now=now):
                continue
            seen.add(key)
            tenant = Tenant.objects.get(pk=finding.tenant_id)
            end_user = EndUser.objects.get(pk=finding.end_user_id) if finding.end_user_id else None
            tripped.append(
                kill_switch_trip(
                    scope=SwitchScope(tenant=tenant, end_user=end_user),
                    reason=finding.reason,
                    automatic=True,
                    detector=finding.detector,
                    auto_clear_at=auto_clear_at,
                    now=now,
                )
            )
    return tripped


def _left_alone(key: tuple[int, int | None], *, since: datetime, now: datetime) -> bool:
    """Already tripped, or a person cleared this scope within the window."""
    tenant_id, end_user_id = key
    on_scope = KillSwitch.objects.filter(
        tenant_id=tenant_id, end_user_id=end_user_id, provider="", model=""
    )
    return on_scope.filter(switch_open_q(now) | Q(cleared_at__gte=since)).exists()


def _findings(plan: Plan, *, since: datetime, now: datetime) -> Iterator[Finding]:
    tenants = Tenant.objects.filter(plan=plan)
    if plan.anomaly_reservations_per_minute is not None:
        yield from _runaway(plan, tenants, now=now)
    if plan.anomaly_end_user_spend is not None:
        yield from _velocity(plan.anomaly_end_user_spend, tenants, since, per_end_user=True)
    if plan.anomaly_tenant_spend is not None:
        yield from _velocity(plan.anomaly_tenant_spend, tenants, since, per_end_user=False)
    if plan.anomaly_failure_share is not None:
        yield from _failure_storm(plan, tenants, since)


def _runaway(plan: Plan, tenants: QuerySet[Tenant], *, now: datetime) -> Iterator[Finding]:
    limit = plan.anomaly_reservations_per_minute
    assert limit is not None
    rows = (
        Reservation.objects.filter(
            tenant__in=tenants, end_user__isnull=False, created_at__gt=now - timedelta(minutes=1)
        )
        .values("tenant", "end_user")
        .annotate(n=Count("pk"))
        .filter(n__gt=limit)
    )
    for row in rows:
        yield Finding(
            RUNAWAY,
            row["tenant"],
            row["end_user"],
            f"Runaway loop: {row['n']} reservations in the last minute by one end user "
            f"(the plan {plan.name!r} allows {limit}).",
        )


def _velocity(
    threshold: Decimal, tenants: QuerySet[Tenant], since: datetime, *, per_end_user: bool
) -> Iterator[Finding]:
    group = ("tenant", "end_user") if per_end_user else ("tenant",)
    totals: dict[tuple[int, int | None], Decimal] = {}
    # Spend only: a reset of one counter's spend must not hide a runaway.
    lines = UsageRecord.objects.spend().filter(tenant__in=tenants, created_at__gt=since)
    held = Reservation.objects.filter(
        tenant__in=tenants, state=ReservationState.HELD, created_at__gt=since
    )
    if per_end_user:
        lines = lines.filter(end_user__isnull=False)
        held = held.filter(end_user__isnull=False)
    for query, field in ((lines, "cost"), (held, "amount")):
        for row in query.values(*group).annotate(total=Sum(field)):
            key = (row["tenant"], row.get("end_user"))
            totals[key] = totals.get(key, ZERO) + round_charge(Decimal(str(row["total"])))
    who = "one end user" if per_end_user else "the tenant"
    for (tenant_id, end_user_id), total in sorted(totals.items(), key=lambda kv: str(kv[0])):
        if total > threshold:
            yield Finding(
                VELOCITY,
                tenant_id,
                end_user_id,
                f"Spend velocity: {who} spent {display(total)} since {since:%H:%M} UTC "
                f"(the plan allows {display(threshold)} per window).",
            )


def _failure_storm(plan: Plan, tenants: QuerySet[Tenant], since: datetime) -> Iterator[Finding]:
    share = plan.anomaly_failure_share
    assert share is not None
    # A hold counts once it ended, or once it became uncertain (a timeout or a lost worker).
    failed = Q(state__in=[ReservationState.RELEASED, ReservationState.EXPIRED]) | Q(
        uncertain_at__gt=since
    )
    rows = (
        Reservation.objects.filter(tenant__in=tenants)
        .filter(Q(settled_at__gt=since) | Q(uncertain_at__gt=since))
        .values("tenant")
        .annotate(total=Count("pk"), failed=Count("pk", filter=failed))
        .filter(total__gte=plan.anomaly_failure_min_holds)
    )
    for row in rows:
        observed = Decimal(row["failed"]) / Decimal(row["total"])
        if observed > share:
            yield Finding(
                FAILURES,
                row["tenant"],
                None,
                f"Failure storm: {row['failed']} of {row['total']} holds settled since "
                f"{since:%H:%M} UTC were released, expired or uncertain (the plan allows "
                f"{share:.0%}).",
            )
