"""Alert events at their sources (issue 28, items 1 and 3): each written with its cause, in its
transaction, once; nothing written when nobody subscribes; bodies held to their schemas."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.alerts.bodies import SCHEMAS, AlertBodyInvalid, UnknownEventType, body_check
from llm_budgets.alerts.emit import alert_emit
from llm_budgets.alerts.endpoints import endpoint_create, endpoint_disable
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.thresholds import thresholds_scan
from llm_budgets.models import AlertDelivery, AlertEvent, Tenant
from tests.factories import reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db

ALL = [schema.type for schema in SCHEMAS]
# What a tenant's endpoint may subscribe to (the operators-only types are refused for it).
TENANTS = [schema.type for schema in SCHEMAS if schema.tenant_visible]


def webhook(tenant: str | None = None, types: list[str] | None = None) -> object:
    owner = Tenant.objects.get(external_id=tenant) if tenant else None
    endpoint, _ = endpoint_create(
        tenant=owner,
        kind="webhook",
        target="https://hooks.example.com/x",
        event_types=types or (TENANTS if owner else ALL),
    )
    return endpoint


def events(event_type: str) -> list[AlertEvent]:
    return list(AlertEvent.objects.filter(type=event_type).order_by("pk"))


def test_nobody_subscribing_costs_no_query_and_writes_nothing() -> None:
    seed()
    webhook(types=["run.closed"])  # subscribed to something else
    alert_emit(
        "alert.test", body={"message": "m", "sent_by": "", "at": "2026-01-01T00:00:00+00:00"}
    )
    with CaptureQueriesContext(connection) as queries:
        assert (
            alert_emit(
                "alert.test",
                body={"message": "m", "sent_by": "", "at": "2026-01-01T00:00:00+00:00"},
            )
            is None
        )
    assert len(queries) == 0
    assert AlertEvent.objects.count() == 0


def test_a_rolled_back_cause_leaves_no_event_and_no_delivery() -> None:
    seed()
    webhook()

    class Undo(Exception):
        pass

    def trip_then_fail() -> None:
        with transaction.atomic():
            budgets.trip(tenant="acme", reason="oops", actor="alice")
            assert AlertDelivery.objects.count() == 1
            raise Undo

    with pytest.raises(Undo):
        trip_then_fail()
    assert AlertEvent.objects.count() == 0
    assert AlertDelivery.objects.count() == 0


def test_kill_switch_trip_and_clear_each_emit_once_with_cause() -> None:
    seed()
    webhook()
    budgets.trip(tenant="acme", reason="runaway", actor="alice")
    budgets.trip(tenant="acme", reason="again", actor="bob")  # already tripped: nothing new
    budgets.clear(tenant="acme", reason="fixed", actor="carol")
    (tripped,) = events("kill_switch.tripped")
    (cleared,) = events("kill_switch.cleared")
    assert tripped.body["cause"] == "manual"
    assert tripped.body["reason"] == "runaway"
    assert tripped.body["tenant"] == "acme"
    assert cleared.body["clear_reason"] == "fixed"
    assert cleared.body["cleared_by"] == "carol"


def test_tenant_endpoints_get_their_own_events_only_operators_get_all() -> None:
    seed()
    seed(tenant="globex")
    acme_hook = webhook("acme")
    globex_hook = webhook("globex")
    operators = webhook()
    budgets.trip(tenant="acme", reason="r", actor="a")
    budgets.trip(reason="global stop", actor="a")  # installation-wide: operators only
    by_endpoint: dict[int, list[str]] = {}
    for delivery in AlertDelivery.objects.select_related("event").order_by("pk"):
        by_endpoint.setdefault(delivery.endpoint_id, []).append(delivery.event.body["scope"])
    assert by_endpoint[acme_hook.pk] == ["tenant acme"]  # type: ignore[attr-defined]
    assert globex_hook.pk not in by_endpoint  # type: ignore[attr-defined]
    assert by_endpoint[operators.pk] == ["tenant acme", "global"]  # type: ignore[attr-defined]


def test_a_disabled_endpoint_gets_no_new_deliveries() -> None:
    seed()
    endpoint = webhook()
    endpoint_disable(endpoint, reason="maintenance")  # type: ignore[arg-type]
    budgets.trip(tenant="acme", reason="r", actor="a")
    assert AlertDelivery.objects.count() == 0


def test_run_closed_emits_once() -> None:
    seed()
    webhook()
    budgets.close_run(tenant="acme", run="run-1", actor="alice", reason="done")
    budgets.close_run(tenant="acme", run="run-1", actor="alice", reason="done")
    (event,) = events("run.closed")
    assert (event.body["run"], event.body["closed_by"], event.body["reason"]) == (
        "run-1",
        "alice",
        "done",
    )


def test_budget_exhausted_once_per_period_at_the_first_refusal() -> None:
    seed(limit="50")
    webhook("acme")
    reserve_30()
    for _ in range(3):
        with pytest.raises(BudgetExceeded):
            reserve_30()
    (event,) = events("budget.exhausted")
    assert event.body["remaining"] == "20.0000000000"
    assert event.body["requested"] == "30.0000000000"
    assert Decimal(event.body["limit"]) == Decimal(50)
    assert event.dedupe_key is not None
    assert AlertDelivery.objects.filter(event=event).count() == 1


def test_budget_exhausted_once_even_when_the_process_forgot_it() -> None:
    from llm_budgets.alerts.emit import alerts_cache_clear

    seed(limit="50")
    webhook("acme")
    reserve_30()
    with pytest.raises(BudgetExceeded):
        reserve_30()
    alerts_cache_clear()  # another process: only the unique key stops a second event
    with pytest.raises(BudgetExceeded):
        reserve_30()
    assert len(events("budget.exhausted")) == 1


def test_threshold_crossing_emits_with_its_record_once() -> None:
    seed(limit="100")
    webhook("acme")
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    reserve_30().commit(input_tokens=0, output_tokens=1000)
    thresholds_scan()
    thresholds_scan()
    (event,) = events("threshold.crossed")
    assert event.body["threshold"] == 50
    assert event.body["spent"] == "60.0000000000"
    assert event.tenant is not None
    assert event.tenant.external_id == "acme"


def test_expired_holds_emit_from_the_sweep() -> None:
    from llm_budgets.engine.settlement import reservations_sweep

    seed(limit="1000")
    webhook("acme", ["hold.expired"])
    past = timezone.now() - timedelta(hours=1)
    reserve_30_at(past, ttl=60)
    reserve_30_at(past, ttl=60)
    assert reservations_sweep() == 2
    bodies = [e.body for e in events("hold.expired")]
    assert len(bodies) == 2
    assert {b["policy"] for b in bodies} == {"charge"}
    assert {b["amount"] for b in bodies} == {"30.0000000000"}


@pytest.mark.parametrize("event_type", ALL)
def test_every_schema_refuses_a_missing_an_extra_and_a_float_money_field(event_type: str) -> None:
    schema = next(s for s in SCHEMAS if s.type == event_type)
    kind = next(iter(schema.fields.values()))
    with pytest.raises(AlertBodyInvalid, match="missing"):
        body_check(event_type, {})
    with pytest.raises(AlertBodyInvalid, match="unexpected 'surprise'"):
        body_check(event_type, {"surprise": 1})
    money = [n for n, k in schema.fields.items() if k.startswith("money")]
    if money:
        with pytest.raises(AlertBodyInvalid, match="must be money"):
            body_check(event_type, {money[0]: 1.5})
    assert kind  # every field has a kind


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(UnknownEventType):
        alert_emit("budget.nearly_done", body={})


def test_a_kill_switch_trips_even_when_its_alert_cannot_be_recorded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import DatabaseError

    from llm_budgets.alerts import emit
    from llm_budgets.models import KillSwitch

    seed()
    webhook()

    def broken(*args: object) -> list[object]:
        raise DatabaseError("alerts table unavailable")

    monkeypatch.setattr(emit, "_endpoints_for", broken)
    budgets.trip(tenant="acme", reason="runaway", actor="alice")
    assert KillSwitch.objects.filter(cleared_at__isnull=True).count() == 1
    assert AlertEvent.objects.count() == 0
    assert "could not be recorded" in caplog.text
