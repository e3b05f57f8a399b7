"""The admin's prepaid balances (issue 30): shown with their figures, adjusted through the
service with a reason (audited), only with the permission."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from llm_budgets import budgets
from llm_budgets.billing.credits import account_of, balance_open, balance_state
from llm_budgets.models import AuditEvent, TopUp
from tests.factories import seed

pytestmark = pytest.mark.django_db


def staff(*perms: str) -> Client:
    user = User.objects.create_user("s", is_staff=True)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_shows_a_balance_and_adjusts_it_with_a_reason() -> None:
    seed(limit="1000")
    balance_open(tenant="acme")
    account = account_of("acme")
    client = staff("view_creditaccount", "change_creditaccount")
    assert (
        "0.00 USD</span> available"
        in client.get(f"/admin/llm_budgets/creditaccount/{account.pk}/change/").content.decode()
    )
    url = f"/admin/llm_budgets/creditaccount/{account.pk}/adjust/"
    answer = client.post(
        url, {"direction": "add", "amount": "12.5", "kind": "promotional", "reason": "goodwill"}
    )
    assert answer.status_code == 302
    assert balance_state(account).credit == Decimal("12.5")
    audit = AuditEvent.objects.get(action="credits.add")
    assert (audit.actor, audit.reason) == ("s", "goodwill")
    refused = client.post(
        url, {"direction": "remove", "amount": "20", "kind": "paid", "reason": "x"}
    )
    assert refused.status_code == 200
    assert "only 12.50 is neither spent nor held" in refused.content.decode()


def test_adjusting_needs_the_permission() -> None:
    budgets.ensure_tenant(tenant="acme", name="Acme")
    balance_open(tenant="acme")
    client = staff("view_creditaccount")
    url = f"/admin/llm_budgets/creditaccount/{account_of('acme').pk}/adjust/"
    assert (
        client.post(
            url, {"direction": "add", "amount": "5", "kind": "paid", "reason": "r"}
        ).status_code
        == 403
    )
    assert balance_state(account_of("acme")).credit == 0


def test_the_admin_sets_and_turns_off_auto_recharge_audited() -> None:
    budgets.ensure_tenant(tenant="acme", name="Acme")
    balance_open(tenant="acme")
    client = staff("view_creditaccount", "change_creditaccount")
    url = f"/admin/llm_budgets/creditaccount/{account_of('acme').pk}/recharge/"
    refused = client.post(url, {"below": "10", "amount": "50", "daily_max": "20", "reason": "r"})
    assert "daily_max 20.00 is less than one recharge of 50.00" in refused.content.decode()
    assert client.post(url, {"below": "10", "amount": "50", "reason": "asked"}).status_code == 302
    account = account_of("acme")
    assert (account.recharge_below, account.recharge_amount) == (Decimal(10), Decimal(50))
    # Set while the balance is already below: that is its crossing, queued once.
    assert TopUp.objects.get(kind="recharge").state == "pending"
    assert client.post(url, {"below": "", "amount": "", "reason": "stop"}).status_code == 302
    assert account_of("acme").recharge_below is None
    assert TopUp.objects.get(kind="recharge").state == "skipped"  # turned off: never paid
    assert AuditEvent.objects.filter(action="credits.recharge_rule").count() == 2
