"""One figure for what a tenant spent (issue #22.8): the tenant's counter, the pages, the usage
API, the export and the rollups all give the same total after staff corrections. A reset of an
end user's spend gives that user's budget its allowance back; it is not money, so no total of
spend moves (``UsageRecord.objects.spend()``); a void gives money back everywhere."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.engine.adjustments import end_user_spend_reset, usage_void
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.jobs.rollups import daily_usage_rebuild, daily_usage_totals
from llm_budgets.models import (
    EndUser,
    Membership,
    MembershipRole,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from tests.api import BASE, new_key
from tests.api import client_for as api_client
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


def _use(end_user: str, output_tokens: int) -> UsageRecord:
    """One committed call: 0.03 per output token."""
    reserve_30(end_user=end_user).commit(input_tokens=0, output_tokens=output_tokens)
    return UsageRecord.objects.filter(end_user__external_id=end_user).latest("pk")


def _tenant_spent() -> Decimal:
    (tenant,) = [b for b in budgets.status(tenant="acme") if b.scope == Scope.TENANT]
    return tenant.spent


def _surfaces(client: Client, key: str) -> dict[str, Decimal]:
    """Every tenant-facing total of the current period."""
    today = timezone.now().date()
    daily_usage_rebuild(since=today - timedelta(days=2), until=today + timedelta(days=1))
    api = api_client(key)
    figures = {"status": _tenant_spent()}
    for group_by in ("day", "model", "end_user"):
        response = api.get(f"{BASE}tenants/acme/usage", {"group_by": group_by})
        assert response.status_code == 200, response.content
        figures[f"usage api by {group_by}"] = Decimal(response.json()["total"])
    figures["overview"] = client.get("/usage/").context["period_total"]
    figures["models page"] = client.get("/usage/models/").context["total"]
    figures["users page"] = client.get("/usage/users/").context["total"]
    export = client.get("/usage/export.csv")
    rows = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode())))
    cost = rows[0].index("cost")
    figures["export"] = sum((Decimal(row[cost]) for row in rows[1:]), Decimal(0))
    tenant = Tenant.objects.get(external_id="acme")
    figures["rollups"] = sum(
        (d.cost for d in daily_usage_totals(tenant, since=today - timedelta(2), until=today)),
        Decimal(0),
    )
    return figures


def test_every_surface_says_what_the_tenant_spent_after_resets_and_voids() -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(40), window="month")
    user = User.objects.create_user("ann", password="pw")  # type: ignore[arg-type]
    tenant = Tenant.objects.get(external_id="acme")
    Membership.objects.create(user=user, tenant=tenant, role=MembershipRole.ADMIN)
    client = Client()
    client.force_login(user)
    key = new_key("acme")

    _use("u-1", 500)  # 15
    _use("u-2", 200)  # 6
    u1 = EndUser.objects.get(external_id="u-1")
    end_user_spend_reset(end_user=u1, reason="goodwill")  # a counter-only line of -15
    _use("u-1", 400)  # 12
    end_user_spend_reset(end_user=u1, reason="goodwill again")  # -12
    voided = _use("u-2", 100)  # 3, then voided: money given back
    usage_void(record_id=voided.pk, reason="duplicate")

    resets = UsageRecord.objects.filter(kind=UsageKind.ADJUSTMENT, counter__isnull=False)
    assert resets.count() == 2
    spent = Decimal(15 + 6 + 12)
    figures = _surfaces(client, key)
    assert figures == dict.fromkeys(figures, spent), figures
    # The user's own budget got its allowance back; the money was still spent.
    (mine,) = [
        b
        for b in budgets.status(tenant="acme", end_user="u-1")
        if b.scope == Scope.END_USER_DEFAULT
    ]
    assert mine.spent == 0
    assert counters_drift() == []
