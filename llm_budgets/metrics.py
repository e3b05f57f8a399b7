"""Prometheus metrics (``pip install llm-budgets[metrics]``), served by :func:`metrics_view`, which
the host mounts where its scraper looks (docs/operations.md)::

    path("metrics/llm-budgets", llm_budgets.metrics.metrics_view)

Two kinds:

- **Counted in the process** on the paths that already run (admissions, refusals, latency,
  settlements, expiries, sweep runs, trips): a counter increment or a histogram observation each.
  Without ``prometheus_client`` these functions do nothing and the view answers 501. Under
  gunicorn or Celery with several processes set ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
  multiprocess mode) so every process's counts are summed.
- **Read from the ledger at scrape time** (holds outstanding and their age, uncertain holds, sweep
  lag, kill switches open, warning emails by state, refusals recorded in the last five minutes,
  the Stripe outbox's backlog and its deliveries pending or parked):
  a few indexed aggregate queries per scrape, nothing on the admission path, and correct across
  every process and machine because they read the database.

Label values are bounded sets (outcome, reason code, scope kind, action, state): never a tenant,
end user, key or model. Each distinct label set is its own time series held in memory by every
process and by Prometheus; a label per tenant turns one series into as many as there are tenants
(times reasons, times histogram buckets), which is what takes Prometheus servers down. Per-tenant
numbers live in the ledger, the pages and the structured logs (:mod:`llm_budgets.events`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily

    ENABLED = True
except ImportError:  # the optional extra is absent: every function below is a no-op
    ENABLED = False

# Admission takes 1-20 ms when healthy; the bound on lock waits is seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

if ENABLED:
    ADMISSIONS = Counter(
        "llm_budgets_admissions",
        "Admission attempts by outcome (admitted, refused, error), reason code and scope kind.",
        ["outcome", "reason", "scope_kind"],
    )
    ADMISSION_SECONDS = Histogram(
        "llm_budgets_admission_seconds",
        "Time to admit or refuse a call (reservation_create), by outcome.",
        ["outcome"],
        buckets=_LATENCY_BUCKETS,
    )
    SETTLEMENTS = Counter(
        "llm_budgets_settlements",
        "Settlement calls by action (commit, release, extend, uncertain) and result code.",
        ["action", "result"],
    )
    EXPIRED = Counter("llm_budgets_holds_expired", "Holds expired by the sweep.")
    SWEEP_RUNS = Counter("llm_budgets_sweep_runs", "Expiry sweep runs finished in this process.")
    SWEEP_SECONDS = Histogram(
        "llm_budgets_sweep_seconds",
        "Duration of an expiry sweep run.",
        buckets=(0.01, 0.1, 1, 5, 10, 30, 60, 300),
    )
    SWEEP_LAST = Gauge(
        "llm_budgets_sweep_last_finished_timestamp_seconds",
        "When this process last finished a sweep (Unix time); see llm_budgets_sweep_lag_seconds "
        "for the database's view.",
        multiprocess_mode="max",
    )
    GUARD_UNDERESTIMATES = Counter(
        "llm_budgets_guard_underestimate",
        "Guarded calls the provider billed beyond their hold (charged as reported, the excess "
        "as overage), by what went past it (input_tokens, output_tokens, tool_calls, "
        "service_tier, cost).",
        ["reason"],
    )
    TRIPS = Counter(
        "llm_budgets_kill_switch_trips",
        "Kill switches tripped, by scope kind and whether a detector tripped them.",
        ["scope_kind", "automatic"],
    )


def scope_kind(label: str | None) -> str:
    """The kind of a scope label (``tenant acme`` -> ``tenant``): a bounded set, for metrics."""
    if not label:
        return "none"
    first = label.split(",")[0].strip()
    for prefix, kind in (
        ("global", "global"),
        ("tenant ", "tenant"),
        ("end user ", "end_user"),
        ("provider ", "provider"),
        ("model ", "model"),
        ("API key ", "api_key"),
    ):
        if first == prefix or first.startswith(prefix):
            return kind
    return "other"


def admission_observe(outcome: str, reason: str, scope_kind: str, seconds: float) -> None:
    if ENABLED:
        ADMISSIONS.labels(outcome, reason, scope_kind).inc()
        ADMISSION_SECONDS.labels(outcome).observe(seconds)


def settlement_observe(action: str, result: str) -> None:
    if ENABLED:
        SETTLEMENTS.labels(action, result).inc()


def guard_underestimate_observe(reason: str) -> None:
    if ENABLED:
        GUARD_UNDERESTIMATES.labels(reason).inc()


def expiry_observe(count: int = 1) -> None:
    if ENABLED and count:
        EXPIRED.inc(count)


def sweep_observe(seconds: float) -> None:
    if ENABLED:
        SWEEP_RUNS.inc()
        SWEEP_SECONDS.observe(seconds)
        SWEEP_LAST.set_to_current_time()


class LedgerCollector:
    """Gauges read from the database when Prometheus scrapes (indexed aggregates only)."""

    def collect(self) -> Iterator[Any]:
        from django.db.models import Count, Min
        from django.utils import timezone

        from llm_budgets.control.killswitches import switch_open_q
        from llm_budgets.models import (
            KillSwitch,
            Refusal,
            Reservation,
            ReservationState,
            ThresholdCrossing,
        )

        now = timezone.now()
        holds = GaugeMetricFamily(
            "llm_budgets_holds_outstanding",
            "Reservations holding budget, by state (held; uncertain: outcome unknown).",
            labels=["state"],
        )
        age = GaugeMetricFamily(
            "llm_budgets_holds_oldest_age_seconds",
            "Age of the oldest reservation in each holding state.",
            labels=["state"],
        )
        live = {
            str(row["state"]): (int(row["n"]), row["oldest"])
            for row in Reservation.objects.filter(
                state__in=[ReservationState.HELD, ReservationState.UNCERTAIN]
            )
            .values("state")
            .annotate(n=Count("pk"), oldest=Min("created_at"))
        }
        for state in (ReservationState.HELD, ReservationState.UNCERTAIN):
            count, oldest = live.get(str(state), (0, None))
            holds.add_metric([str(state)], count)
            age.add_metric([str(state)], (now - oldest).total_seconds() if oldest else 0.0)
        yield holds
        yield age

        overdue = (
            Reservation.objects.filter(state=ReservationState.HELD, expires_at__lte=now)
            .order_by("expires_at")
            .values_list("expires_at", flat=True)
            .first()
        )
        yield GaugeMetricFamily(
            "llm_budgets_sweep_lag_seconds",
            "How long the most overdue held reservation has been past its expiry (0: none).",
            value=(now - overdue).total_seconds() if overdue else 0.0,
        )

        open_ = GaugeMetricFamily(
            "llm_budgets_kill_switches_open",
            "Kill switches open now (tripped, not cleared, not past auto-clear), by scope kind.",
            labels=["scope_kind"],
        )
        kinds: dict[str, int] = {}
        for switch in KillSwitch.objects.filter(switch_open_q(now)).select_related(
            "tenant", "end_user__tenant", "api_key"
        ):
            kind = scope_kind(switch.scope_label)
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind, n in sorted(kinds.items()):
            open_.add_metric([kind], n)
        yield open_

        warnings = GaugeMetricFamily(
            "llm_budgets_warnings",
            "Warning-threshold crossings by delivery state (sent: warning emails sent).",
            labels=["state"],
        )
        for state, n in ThresholdCrossing.objects.values_list("state").annotate(n=Count("pk")):
            warnings.add_metric([str(state)], int(n))
        yield warnings

        recent = GaugeMetricFamily(
            "llm_budgets_refusals_recent",
            "Refusals recorded in the last five minutes, across every process, by kind.",
            labels=["kind"],
        )
        since = now - timedelta(minutes=5)
        for kind, n in (
            Refusal.objects.filter(created_at__gte=since)
            .values_list("kind")
            .annotate(n=Count("pk"))
        ):
            recent.add_metric([str(kind)], int(n))
        yield recent
        yield from _stripe_outbox(now)


def _stripe_outbox(now: Any) -> Iterator[Any]:
    """The Stripe outbox's backlog (lines not yet built into a delivery: the partial index on
    undelivered lines) and the deliveries due or parked, by state, with the oldest's age."""
    from django.db.models import Count, Min

    from llm_budgets.models import BillingLine, MeterDelivery, MeterDeliveryState

    # Watched: due to be sent, and refused by Stripe until a person retries. Sent, empty and
    # too-old deliveries only accumulate (the admin counts them).
    watched = (MeterDeliveryState.PENDING.value, MeterDeliveryState.PARKED.value)
    backlog = BillingLine.objects.filter(delivery__isnull=True).aggregate(
        n=Count("pk"), oldest=Min("occurred_at")
    )
    yield GaugeMetricFamily(
        "llm_budgets_stripe_outbox_lines",
        "Outbox rows (ledger lines of linked tenants) not yet built into a Stripe delivery.",
        value=int(backlog["n"] or 0),
    )
    oldest = backlog["oldest"]
    yield GaugeMetricFamily(
        "llm_budgets_stripe_outbox_oldest_age_seconds",
        "Age of the oldest outbox row not yet built into a delivery (0: none). Rows wait for "
        "their UTC hour to close, so up to about 3,700 s is normal.",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )
    deliveries = GaugeMetricFamily(
        "llm_budgets_stripe_deliveries",
        "Stripe meter deliveries by state: pending (due to be sent or retried), parked "
        "(refused by Stripe; a person retries it once fixed).",
        labels=["state"],
    )
    ages = GaugeMetricFamily(
        "llm_budgets_stripe_deliveries_oldest_age_seconds",
        "Age of the oldest delivery in each watched state (0: none).",
        labels=["state"],
    )
    found = {
        str(row["state"]): (int(row["n"]), row["oldest"])
        for row in MeterDelivery.objects.filter(state__in=watched)
        .values("state")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
    }
    for state in watched:
        count, first = found.get(state, (0, None))
        deliveries.add_metric([state], count)
        ages.add_metric([state], (now - first).total_seconds() if first else 0.0)
    yield deliveries
    yield ages


def trip_observe(scope_kind: str, automatic: bool) -> None:
    if ENABLED:
        TRIPS.labels(scope_kind, "true" if automatic else "false").inc()


def metrics_text() -> bytes:
    """The exposition text: this process's (or, in multiprocess mode, every process's) counters,
    then the ledger's gauges."""
    from prometheus_client import generate_latest

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        process_registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(process_registry)
    else:
        process_registry = prometheus_client.REGISTRY
    ledger_registry = CollectorRegistry()
    ledger_registry.register(LedgerCollector())
    return generate_latest(process_registry) + generate_latest(ledger_registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET``: Prometheus text format. Mount it behind whatever protects the host's internal
    endpoints; it holds no tenant data, but counts are business information."""
    if not ENABLED:
        return HttpResponse(
            "prometheus_client is not installed: pip install 'llm-budgets[metrics]'.\n",
            status=501,
            content_type="text/plain",
        )
    from prometheus_client import CONTENT_TYPE_LATEST

    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
