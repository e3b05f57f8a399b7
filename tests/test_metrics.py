"""Prometheus metrics (llm_budgets.metrics): counted on the paths that run, the ledger's gauges
read at scrape time, bounded labels, and a 501 without prometheus_client."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.test import RequestFactory
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from llm_budgets import budgets, metrics
from llm_budgets.exceptions import BudgetExceeded, KillSwitchActive
from tests.factories import reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = metrics.metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_admissions_and_refusals_are_counted_by_reason_and_scope_kind(
    django_capture_on_commit_callbacks: Any,
) -> None:
    seed(limit="50")
    before = scrape()
    reserve_30()
    with pytest.raises(BudgetExceeded):
        reserve_30()
    with django_capture_on_commit_callbacks(execute=True):  # the trip is counted after commit
        budgets.trip(tenant="acme", reason="test")
    with pytest.raises(KillSwitchActive):
        reserve_30()
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    total = "llm_budgets_admissions_total"
    assert delta(total, outcome="admitted", reason="admitted", scope_kind="none") == 1
    assert delta(total, outcome="refused", reason="budget_exceeded", scope_kind="tenant") == 1
    assert delta(total, outcome="refused", reason="kill_switch_active", scope_kind="tenant") == 1
    assert delta("llm_budgets_admission_seconds_count", outcome="admitted") == 1
    assert delta("llm_budgets_admission_seconds_count", outcome="refused") == 2
    assert delta("llm_budgets_kill_switch_trips_total", scope_kind="tenant", automatic="false") == 1
    assert value(after, "llm_budgets_kill_switches_open", scope_kind="tenant") == 1
    assert value(after, "llm_budgets_refusals_recent", kind="budget") == 1
    assert value(after, "llm_budgets_refusals_recent", kind="kill_switch") == 1


def test_holds_their_age_and_the_sweep_lag_are_read_at_scrape_time() -> None:
    seed(limit="1000")
    reserve_30()
    uncertain = reserve_30()
    uncertain.mark_uncertain()
    reserve_30_at(timezone.now() - timedelta(minutes=10), ttl=60)  # overdue by 9 minutes
    samples = scrape()
    assert value(samples, "llm_budgets_holds_outstanding", state="held") == 2
    assert value(samples, "llm_budgets_holds_outstanding", state="uncertain") == 1
    assert value(samples, "llm_budgets_holds_oldest_age_seconds", state="held") >= 600
    assert value(samples, "llm_budgets_sweep_lag_seconds") >= 540

    budgets.sweep()
    samples = scrape()
    assert value(samples, "llm_budgets_holds_outstanding", state="held") == 1
    assert value(samples, "llm_budgets_sweep_lag_seconds") == 0
    assert value(samples, "llm_budgets_holds_expired_total") >= 1
    assert value(samples, "llm_budgets_sweep_runs_total") >= 1


def test_settlements_are_counted_by_action_and_result() -> None:
    seed()
    before = scrape()
    reserve_30().commit(input_tokens=0, output_tokens=10)
    reserve_30().release()
    after = scrape()
    name = "llm_budgets_settlements_total"
    for action in ("commit", "release"):
        assert (
            value(after, name, action=action, result="ok")
            - value(before, name, action=action, result="ok")
            == 1
        )


def test_no_label_carries_a_tenant_end_user_or_model() -> None:
    seed(tenant="tenant-zebra")
    reserve_30(tenant="tenant-zebra", end_user="user-okapi")
    with pytest.raises(BudgetExceeded):
        reserve_30(tenant="tenant-zebra", end_user="user-okapi", max_output_tokens=100_000)
    budgets.trip(tenant="tenant-zebra", end_user="user-okapi", reason="test")
    text = metrics.metrics_text().decode()
    assert not re.search(r"zebra|okapi|m30", text)


def test_without_prometheus_client_the_view_answers_501(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "ENABLED", False)
    response = metrics.metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 501
    assert b"llm-budgets[metrics]" in response.content
    # The hot path's hooks are no-ops then.
    metrics.admission_observe("admitted", "admitted", "none", 0.001)


def test_a_switch_past_its_auto_clear_time_is_not_counted_open(
    django_capture_on_commit_callbacks: Any,
) -> None:
    seed()
    with django_capture_on_commit_callbacks(execute=True):
        budgets.trip(tenant="acme", reason="until the deploy")
        budgets.trip(
            provider="fake", reason="a blip", auto_clear_at=timezone.now() + timedelta(minutes=5)
        )
    samples = scrape()
    assert value(samples, "llm_budgets_kill_switches_open", scope_kind="tenant") == 1
    assert value(samples, "llm_budgets_kill_switches_open", scope_kind="provider") == 1
    with time_machine.travel(timezone.now() + timedelta(minutes=6)):
        samples = scrape()
    assert value(samples, "llm_budgets_kill_switches_open", scope_kind="tenant") == 1
    assert value(samples, "llm_budgets_kill_switches_open", scope_kind="provider") == 0


def test_the_stripe_outbox_backlog_and_parked_deliveries_are_read_at_scrape_time() -> None:
    from llm_budgets.billing.outbox import linked_cache_clear
    from llm_budgets.models import MeterDelivery, MeterDeliveryState, Tenant

    seed(limit="1000")
    samples = scrape()
    assert value(samples, "llm_budgets_stripe_outbox_lines") == 0
    assert value(samples, "llm_budgets_stripe_outbox_oldest_age_seconds") == 0
    assert value(samples, "llm_budgets_stripe_deliveries", state="parked") == 0

    budgets.link_stripe_customer(tenant="acme", customer_id="cus_metrics")
    linked_cache_clear()
    an_hour_ago = timezone.now() - timedelta(hours=1)
    with time_machine.travel(an_hour_ago, tick=False):
        reserve_30().commit(input_tokens=0, output_tokens=100)
    reserve_30().commit(input_tokens=0, output_tokens=100)
    tenant = Tenant.objects.get(external_id="acme")
    for index, (state, age) in enumerate(
        [
            (MeterDeliveryState.PARKED, timedelta(hours=5)),
            (MeterDeliveryState.PARKED, timedelta(hours=1)),
            (MeterDeliveryState.PENDING, timedelta(minutes=2)),
            (MeterDeliveryState.SENT, timedelta(days=3)),
        ]
    ):
        moment = timezone.now() - age
        MeterDelivery.objects.create(
            tenant=tenant,
            customer_id="cus_metrics",
            event_name="llm_usage",
            hour=moment.replace(minute=0, second=0, microsecond=0),
            timestamp=moment,
            identifier=f"id-{index}",
            amount=1,
            units=1_000_000,
            currency="USD",
            state=state,
            next_attempt_at=moment,
            created_at=moment,
        )
    samples = scrape()
    assert value(samples, "llm_budgets_stripe_outbox_lines") == 2
    assert 3500 <= value(samples, "llm_budgets_stripe_outbox_oldest_age_seconds") < 3700
    assert value(samples, "llm_budgets_stripe_deliveries", state="parked") == 2
    assert value(samples, "llm_budgets_stripe_deliveries", state="pending") == 1
    assert value(samples, "llm_budgets_stripe_deliveries", state="sent") == 0  # not watched
    parked_age = value(samples, "llm_budgets_stripe_deliveries_oldest_age_seconds", state="parked")
    assert 5 * 3600 - 60 < parked_age < 5 * 3600 + 60
    # Bounded labels: no customer id, tenant or event name in the text.
    assert not re.search(r"cus_metrics|acme|llm_usage\b", metrics.metrics_text().decode())
