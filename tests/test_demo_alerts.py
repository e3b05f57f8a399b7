"""``make demo``'s alerts part (demo/alerts_demo.py): a threshold alert reaches a receiver on
127.0.0.1, signed, once per crossing, and a rerun does it again on the same tenant."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from llm_budgets.models import AlertDelivery, AlertEndpoint, Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _run() -> str:
    out = StringIO()
    call_command("llm_budgets_demo_alerts", stdout=out)
    return out.getvalue()


def test_the_demo_delivers_a_signed_threshold_alert_and_reruns() -> None:
    first = _run()
    assert "crossings (50%, 80%)" in first
    assert '"threshold": 80' in first
    assert "Signatures verified" in first
    second = _run()
    assert "Signatures verified" in second
    # One tenant and one endpoint however often it runs; every delivery delivered.
    assert Tenant.objects.filter(external_id="demo-alerts").count() == 1
    assert AlertEndpoint.objects.count() == 1
    assert set(AlertDelivery.objects.values_list("state", flat=True)) == {"delivered"}
    assert AlertDelivery.objects.count() == 4
