"""A tenant's billing contacts are an email alert endpoint (migration 0032): the warnings go to
the tenant's email endpoints that subscribe to them, ``ensure_tenant(billing_emails=...)`` keeps
working, and the migration carries every tenant's addresses over without loss (and back)."""

from __future__ import annotations

import pytest
from django.core import mail

from llm_budgets import budgets
from llm_budgets.alerts.emit import alert_emit
from llm_budgets.alerts.endpoints import endpoint_create, warning_recipients
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import AlertDelivery, AlertEndpoint, AuditEvent, Tenant


@pytest.mark.django_db
def test_billing_emails_set_the_tenants_billing_contacts_endpoint() -> None:
    budgets.ensure_tenant(tenant="acme", billing_emails="a@acme.test\nb@acme.test")
    [endpoint] = AlertEndpoint.objects.all()
    assert (endpoint.kind, endpoint.target, endpoint.billing_contacts) == (
        "email",
        "a@acme.test, b@acme.test",
        True,
    )
    assert endpoint.event_types == ["threshold.crossed", "budget.projected_to_exceed"]
    tenant = Tenant.objects.get(external_id="acme")
    assert tenant.billing_contacts == ["a@acme.test", "b@acme.test"]
    assert budgets.ensure_tenant(tenant="acme").billing_emails == "a@acme.test, b@acme.test"
    # Changed, then cleared: the one endpoint follows, audited on the tenant.
    budgets.ensure_tenant(tenant="acme", billing_emails="c@acme.test")
    assert AlertEndpoint.objects.get().target == "c@acme.test"
    update = AuditEvent.objects.filter(action="tenant.update").latest("pk")
    assert update.before == {"billing_emails": "a@acme.test, b@acme.test"}
    assert update.after == {"billing_emails": "c@acme.test"}
    budgets.ensure_tenant(tenant="acme", billing_emails="")
    assert not AlertEndpoint.objects.exists()
    assert Tenant.objects.get(external_id="acme").billing_contacts == []


@pytest.mark.django_db
def test_a_bad_address_is_refused_by_field_and_nothing_is_written() -> None:
    with pytest.raises(InvalidUsage) as refused:
        budgets.ensure_tenant(tenant="acme", billing_emails="a@acme.test, not-an-address")
    assert refused.value.field == "billing_emails"
    assert "'not-an-address' is not one" in str(refused.value)
    assert not Tenant.objects.exists()
    assert not AlertEndpoint.objects.exists()


@pytest.mark.django_db
def test_warnings_reach_every_subscribing_email_endpoint_once_and_no_alert_email_besides() -> None:
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.test")
    tenant = Tenant.objects.get(external_id="acme")
    endpoint_create(
        tenant=tenant,
        kind="email",
        target="ops@acme.test, billing@acme.test",
        event_types=["threshold.crossed", "kill_switch.tripped"],
    )
    assert warning_recipients(tenant, "threshold.crossed") == [
        "billing@acme.test",
        "ops@acme.test",
    ]
    assert warning_recipients(tenant, "budget.projected_to_exceed") == ["billing@acme.test"]
    # The warnings job sends that email; the alert of the same event adds no second one.
    body = {
        "budget_id": 1,
        "scope": "tenant acme",
        "window": "month",
        "tenant": "acme",
        "end_user": None,
        "limit": "10.0000000000",
        "currency": "USD",
        "period_start": "2026-12-01T00:00:00+00:00",
        "spent": "8.0000000000",
        "reserved": "0.0000000000",
        "at": "2026-12-05T10:00:00+00:00",
        "threshold": 80,
    }
    assert alert_emit("threshold.crossed", tenant=tenant, body=body) is None
    assert not AlertDelivery.objects.exists()


@pytest.mark.django_db
def test_a_crossing_emails_the_billing_contacts_through_their_endpoint() -> None:
    from llm_budgets.jobs.thresholds import threshold_warning_send, thresholds_scan
    from tests.factories import reserve_30, seed

    seed(tenant="acme", limit="36")
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.test")
    reserve_30(tenant="acme").commit(input_tokens=0, output_tokens=1000)  # 30.00: 83%
    states = sorted(threshold_warning_send(crossing) for crossing in thresholds_scan())
    assert states == ["sent", "skipped"]  # 80% emailed; 50% superseded by it
    [message] = mail.outbox
    assert message.to == ["billing@acme.test"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_every_tenants_contacts_over_and_back() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("llm_budgets", "0031_alerts")]
    after = [("llm_budgets", "0032_billing_contacts_endpoint")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    OldTenant = old.get_model("llm_budgets", "Tenant")
    OldTenant.objects.create(external_id="acme", billing_emails="a@acme.test;\nb@acme.test")
    OldTenant.objects.create(external_id="beta", billing_emails="")
    OldTenant.objects.create(external_id="gamma", billing_emails="g@gamma.test")
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    rows = new.get_model("llm_budgets", "AlertEndpoint").objects.order_by("tenant__external_id")
    assert [(e.tenant.external_id, e.target, e.billing_contacts) for e in rows] == [
        ("acme", "a@acme.test, b@acme.test", True),
        ("gamma", "g@gamma.test", True),
    ]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    back = executor.loader.project_state(before).apps
    assert dict(
        back.get_model("llm_budgets", "Tenant").objects.values_list("external_id", "billing_emails")
    ) == {"acme": "a@acme.test, b@acme.test", "beta": "", "gamma": "g@gamma.test"}
    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
