"""The support admin (issue 5, items 2, 5 and 7): the two roles through the Django test client,
each allowed its actions and refused (403) the other's, every action audited."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.clock import when
from llm_budgets.control.killswitches import kill_switch_trip, switch_scope
from llm_budgets.exceptions import BudgetExceeded, KillSwitchActive
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    AuditEvent,
    Budget,
    BudgetRaise,
    Counter,
    KillSwitch,
    Refusal,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.roles import BILLING_ADMIN, SUPPORT
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


def _member(username: str, *groups: str) -> Client:
    user = get_user_model().objects.create_user(username=username, password=None, is_staff=True)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def support() -> Client:
    return _member("support", SUPPORT)


@pytest.fixture
def billing() -> Client:
    return _member("billing", BILLING_ADMIN)


@pytest.fixture
def tenant() -> Tenant:
    """acme capped at 100 a month; u-1 at 50 a month of its own, 30 of it spent."""
    seed(limit="100")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    return Tenant.objects.get(external_id="acme")


def _tenant_url(tenant: Tenant, action: str = "change", *args: object) -> str:
    return reverse(f"admin:llm_budgets_tenant_{action}", args=[tenant.pk, *args])


def _trip(client: Client, tenant: Tenant, reason: str = "attack from u-1") -> int:
    return client.post(
        reverse("admin:llm_budgets_killswitch_add"),
        {"tenant": tenant.pk, "end_user_id": "u-1", "reason": reason, "_save": "1"},
    ).status_code


def test_the_roles_exist_after_migrate() -> None:
    support = set(Group.objects.get(name=SUPPORT).permissions.values_list("codename", flat=True))
    billing = set(
        Group.objects.get(name=BILLING_ADMIN).permissions.values_list("codename", flat=True)
    )
    assert {"view_tenant", "view_refusal", "add_killswitch", "change_killswitch"} <= support
    assert not support & {"change_budget", "add_budgetraise", "reset_spend", "void_usagerecord"}
    assert {"change_budget", "add_budgetraise", "reset_spend", "void_usagerecord"} <= billing
    assert not billing & {"add_killswitch", "change_killswitch"}


def test_support_sees_the_tenant_page_with_refusals_and_why(
    support: Client, tenant: Tenant
) -> None:
    with pytest.raises(BudgetExceeded):
        reserve_30(end_user="u-1")
    budgets.trip(tenant="acme", model="m30", reason="loop in agent v2", actor="alice")
    page = support.get(_tenant_url(tenant))
    assert page.status_code == 200
    html = page.content.decode()
    assert "end user acme/u-1 month budget" in html  # the refusal and why
    assert "loop in agent v2" in html  # the open switch
    assert "Trip a kill switch" in html
    assert "Grant a temporary raise" not in html
    assert "Reset an end user" not in html
    assert ">void<" not in html
    assert page.context["budget_rows"]  # usage bars for the current period


def test_the_tenant_page_lists_only_switches_that_refuse_now(
    support: Client, tenant: Tenant
) -> None:
    """A switch past its auto_clear_at no longer refuses calls, so the page does not list it as
    tripped (issue #10: "open now" has one definition, killswitches.switch_open_q)."""
    now = timezone.now()
    budgets.trip(tenant="acme", model="m30", reason="still tripped", actor="alice")
    lapsed = budgets.trip(
        tenant="acme",
        provider="fake",
        reason="lapsed by itself",
        actor="alice",
        auto_clear_at=now + timedelta(minutes=5),
    )
    KillSwitch.objects.filter(pk=lapsed.id).update(auto_clear_at=now - timedelta(minutes=1))
    rows = support.get(_tenant_url(tenant)).context["switch_rows"]
    assert [row["reason"] for row in rows] == ["still tripped"]


def test_support_trips_and_clears_with_a_reason_audited_and_emailed(
    support: Client, tenant: Tenant, settings: object, django_capture_on_commit_callbacks: object
) -> None:
    settings.LLM_BUDGETS = {"OPERATOR_EMAILS": ["ops@example.com"]}  # type: ignore[attr-defined]
    assert _trip(support, tenant, reason="") == 200  # the form asks for a reason
    assert not KillSwitch.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        assert _trip(support, tenant) == 302
    switch = KillSwitch.objects.get()
    assert switch.scope_label == "end user acme/u-1"
    with pytest.raises(KillSwitchActive) as refused:
        reserve_30(end_user="u-1")
    assert refused.value.tripped_by == "support"
    page = support.get(reverse("admin:llm_budgets_killswitch_change", args=[switch.id]))
    url = reverse("admin:llm_budgets_killswitch_clear", args=[switch.id])
    assert url in page.content.decode()  # the "Clear this switch" button
    assert support.get(url).status_code == 200  # the confirmation, with its reason box
    assert support.post(url, {"clear_reason": ""}).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        cleared = support.post(url, {"clear_reason": "user blocked"}, follow=True)
    assert "Kill switch on end user acme/u-1 cleared" in cleared.content.decode()
    reserve_30(end_user="u-2").release()
    trip, clear = AuditEvent.objects.filter(action__startswith="kill_switch").order_by("pk")
    assert (trip.actor, trip.reason) == ("support", "attack from u-1")
    assert (clear.actor, clear.reason) == ("support", "user blocked")
    assert len(mail.outbox) == 2


def test_support_is_refused_billing_actions(support: Client, tenant: Tenant) -> None:
    budget = Budget.objects.get(scope=Scope.TENANT)
    line = UsageRecord.objects.get()
    until = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    assert (
        support.post(
            reverse("admin:llm_budgets_budgetraise_add"),
            {
                "budget": budget.pk,
                "amount": "10",
                "until_0": until[:10],
                "until_1": until[11:],
                "reason": "x",
            },
        ).status_code
        == 403
    )
    assert (
        support.post(
            _tenant_url(tenant, "reset_end_user"), {"end_user": "u-1", "reason": "x"}
        ).status_code
        == 403
    )
    assert (
        support.post(_tenant_url(tenant, "void_line", line.pk), {"reason": "x"}).status_code == 403
    )
    change = reverse("admin:llm_budgets_budget_change", args=[budget.pk])
    assert support.post(change, {"limit": "500", "reason": "x", "_save": "1"}).status_code == 403
    assert not BudgetRaise.objects.exists()
    assert UsageRecord.objects.count() == 1
    assert Budget.objects.get(pk=budget.pk).limit == 100


def test_billing_admin_is_refused_switches(billing: Client, tenant: Tenant) -> None:
    assert _trip(billing, tenant) == 403
    switch = budgets.trip(tenant="acme", reason="x")
    url = reverse("admin:llm_budgets_killswitch_clear", args=[switch.id])
    assert billing.get(url).status_code == 403
    assert billing.post(url, {"clear_reason": "no"}).status_code == 403
    page = billing.get(reverse("admin:llm_budgets_killswitch_change", args=[switch.id]))
    assert url not in page.content.decode()  # no button for someone who may not clear
    assert KillSwitch.objects.get().cleared_at is None


def test_billing_admin_grants_a_raise_that_expires_by_itself(
    billing: Client, tenant: Tenant
) -> None:
    budget = Budget.objects.get(scope=Scope.TENANT)
    until = timezone.now() + timedelta(hours=2)
    response = billing.post(
        reverse("admin:llm_budgets_budgetraise_add"),
        {
            "budget": budget.pk,
            "amount": "40",
            "until_0": until.strftime("%Y-%m-%d"),
            "until_1": until.strftime("%H:%M:%S"),
            "reason": "launch day",
            "_save": "1",
        },
        follow=True,
    )
    assert response.redirect_chain[-1][0] == _tenant_url(tenant)  # back where support came from
    shown = [str(m) for m in response.context["messages"]]
    assert shown == [
        f"Raise of 40.00 USD on tenant acme's month budget until {when(until, 'UTC')}."
    ]
    granted = BudgetRaise.objects.get()
    assert (granted.amount, granted.granted_by, granted.reason) == (
        Decimal(40),
        "billing",
        "launch day",
    )
    assert budgets.status(tenant="acme")[0].limit == Decimal(140)
    event = AuditEvent.objects.get(action="budget.raise")
    assert (event.actor, event.reason) == ("billing", "launch day")
    assert event.after is not None
    assert event.after["raise"] == "40"


def test_billing_admin_resets_an_end_user_with_a_compensating_line(
    billing: Client, tenant: Tenant
) -> None:
    page = billing.get(_tenant_url(tenant, "reset_end_user"))
    assert page.status_code == 200
    response = billing.post(
        _tenant_url(tenant, "reset_end_user"), {"end_user": "u-1", "reason": "goodwill"}
    )
    assert response.status_code == 302
    adjustment = UsageRecord.objects.get(kind=UsageKind.ADJUSTMENT)
    assert adjustment.cost == Decimal(-30)
    assert Counter.objects.get(budget__scope=Scope.END_USER).spent == 0
    assert counters_drift() == []
    event = AuditEvent.objects.get(action="end_user.reset_spend")
    assert (event.actor, event.reason) == ("billing", "goodwill")
    unknown = billing.post(
        _tenant_url(tenant, "reset_end_user"), {"end_user": "nobody", "reason": "x"}
    )
    assert unknown.status_code == 200  # the form says there is no such end user


def test_billing_admin_voids_a_line_of_this_tenant_only(billing: Client, tenant: Tenant) -> None:
    line = UsageRecord.objects.get()
    seed(tenant="globex")
    assert (
        billing.post(
            reverse(
                "admin:llm_budgets_tenant_void_line",
                args=[Tenant.objects.get(external_id="globex").pk, line.pk],
            ),
            {"reason": "x"},
        ).status_code
        == 404
    )
    html = billing.get(_tenant_url(tenant)).content.decode()
    assert _tenant_url(tenant, "void_line", line.pk) in html
    response = billing.post(_tenant_url(tenant, "void_line", line.pk), {"reason": "refunded"})
    assert response.status_code == 302
    assert UsageRecord.objects.get(voids=line).cost == Decimal(-30)
    assert counters_drift() == []
    event = AuditEvent.objects.get(action="usage.void")
    assert (event.actor, event.reason) == ("billing", "refunded")
    again = billing.post(_tenant_url(tenant, "void_line", line.pk), {"reason": "again"})
    assert again.status_code == 200
    assert "already voided" in again.content.decode()


def test_a_person_in_both_roles_may_do_both(tenant: Tenant) -> None:
    both = _member("both", SUPPORT, BILLING_ADMIN)
    assert _trip(both, tenant) == 302
    response = both.post(
        _tenant_url(tenant, "reset_end_user"), {"end_user": "u-1", "reason": "goodwill"}
    )
    assert response.status_code == 302


def test_billing_admin_changes_a_limit_audited(billing: Client, tenant: Tenant) -> None:
    budget = Budget.objects.get(scope=Scope.TENANT)
    change = reverse("admin:llm_budgets_budget_change", args=[budget.pk])
    response = billing.post(change, {"limit": "500", "reason": "upgrade", "_save": "1"})
    assert response.status_code == 302
    assert Budget.objects.get(pk=budget.pk).limit == 500
    event = AuditEvent.objects.get(action="budget.change_limit")
    assert (event.actor, event.reason) == ("billing", "upgrade")


@pytest.mark.parametrize("model", [KillSwitch, BudgetRaise, Refusal])
def test_control_pages_render_for_a_superuser(tenant: Tenant, model: type) -> None:
    client = _member("root")
    get_user_model().objects.filter(username="root").update(is_superuser=True)
    budgets.trip(tenant="acme", end_user="u-1", reason="x")
    with pytest.raises(KillSwitchActive):
        reserve_30(end_user="u-1")
    BudgetRaise.objects.create(
        budget=Budget.objects.get(scope=Scope.TENANT),
        amount=Decimal(1),
        starts_at=timezone.now(),
        ends_at=timezone.now() + timedelta(hours=1),
        reason="x",
    )
    name = model._meta.model_name
    changelist = client.get(reverse(f"admin:llm_budgets_{name}_changelist") + "?q=acme")
    assert changelist.status_code == 200
    row = model.objects.get()
    assert (
        client.get(reverse(f"admin:llm_budgets_{name}_change", args=[quote(row.pk)])).status_code
        == 200
    )
    add = client.get(reverse(f"admin:llm_budgets_{name}_add"))
    assert add.status_code == (403 if model is Refusal else 200)


def test_the_detector_filter_names_switches_tripped_by_a_person(
    support: Client, tenant: Tenant
) -> None:
    # A switch tripped by hand stores no detector: the filter offers it by name, not as an empty
    # link (``?detector=``, a link without text: issue #33).
    by_hand = switch_scope(tenant="acme", provider="openai")
    by_detector = switch_scope(tenant="acme", provider="anthropic")
    assert by_hand is not None
    assert by_detector is not None
    kill_switch_trip(scope=by_hand, reason="incident", actor="maria")
    kill_switch_trip(scope=by_detector, reason="spike", automatic=True, detector="spend_spike")
    url = reverse("admin:llm_budgets_killswitch_changelist")
    text = support.get(url).content.decode()
    assert 'href="?detector="' not in text
    assert "none (tripped by a person)" in text
    assert 'href="?detector=spend_spike"' in text
    listed = support.get(url, {"detector": "__none__"}).content.decode()
    assert "provider openai" in listed
    assert "provider anthropic" not in listed
