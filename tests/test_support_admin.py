"""The support admin (issue 14): one money format and clock on the screens, lists that say whose
and how much, actions that say what they did, an end user's page, housekeeping, and every action
allowed only with its permission and audited with the person's name."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from llm_budgets import budgets
from llm_budgets.clock import when
from llm_budgets.control.api_keys import api_key_create
from llm_budgets.engine.adjustments import usage_void
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import (
    ApiKey,
    AuditEvent,
    Budget,
    EndUser,
    KillSwitch,
    Plan,
    Price,
    Refusal,
    RefusalKind,
    Scope,
    Tenant,
    UsageRecord,
)
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db


def _client(username: str, codenames: set[str], *, superuser: bool = False) -> Client:
    user = get_user_model().objects.create_user(
        username=username, password=None, is_staff=True, is_superuser=superuser
    )
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="llm_budgets", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def _view_all() -> set[str]:
    return set(
        Permission.objects.filter(
            content_type__app_label="llm_budgets", codename__startswith="view_"
        ).values_list("codename", flat=True)
    )


def _all_but(codename: str) -> set[str]:
    every = Permission.objects.filter(content_type__app_label="llm_budgets")
    return set(every.values_list("codename", flat=True)) - {codename}


@pytest.fixture
def acme() -> Tenant:
    """acme capped at 100 a month in Amsterdam; u-1 at 50 a month of its own, 30 of it spent."""
    seed(limit="100")
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Amsterdam")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("50"), window="month")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    return Tenant.objects.get(external_id="acme")


@pytest.fixture
def superuser() -> Client:
    return _client("lead", set(), superuser=True)


# --- item 8: every action, with and without its permission, audited with the person ------------

Action = Callable[[Client, Tenant], Any]


def _trip(client: Client, tenant: Tenant) -> Any:
    data = {"tenant": tenant.pk, "end_user_id": "u-1", "reason": "loop", "_save": "1"}
    return client.post(reverse("admin:llm_budgets_killswitch_add"), data)


def _clear(client: Client, tenant: Tenant) -> Any:
    switch = budgets.trip(tenant="acme", reason="loop")
    url = reverse("admin:llm_budgets_killswitch_clear", args=[switch.id])
    return client.post(url, {"clear_reason": "fixed"})


def _raise(client: Client, tenant: Tenant) -> Any:
    budget = Budget.objects.get(scope=Scope.TENANT)
    until = timezone.now() + timedelta(days=1)
    data = {
        "budget": budget.pk,
        "amount": "25",
        "until_0": f"{until:%Y-%m-%d}",
        "until_1": f"{until:%H:%M:%S}",
        "reason": "launch",
        "_save": "1",
    }
    return client.post(reverse("admin:llm_budgets_budgetraise_add"), data)


def _reset(client: Client, tenant: Tenant) -> Any:
    url = reverse("admin:llm_budgets_tenant_reset_end_user", args=[tenant.pk])
    return client.post(url, {"end_user": "u-1", "reason": "goodwill"})


def _void(client: Client, tenant: Tenant) -> Any:
    line = UsageRecord.objects.get()
    url = reverse("admin:llm_budgets_tenant_void_line", args=[tenant.pk, line.pk])
    return client.post(url, {"reason": "refunded"})


def _change_limit(client: Client, tenant: Tenant) -> Any:
    budget = Budget.objects.get(scope=Scope.TENANT)
    url = reverse("admin:llm_budgets_budget_change", args=[budget.pk])
    return client.post(url, {"limit": "150", "reason": "upgrade", "_save": "1"})


def _add_budget(client: Client, tenant: Tenant) -> Any:
    data = {"scope": Scope.TENANT, "tenant": tenant.pk, "window": "day", "limit": "10"}
    return client.post(reverse("admin:llm_budgets_budget_add"), {**data, "reason": "new cap"})


def _add_price(client: Client, tenant: Tenant) -> Any:
    data = {
        "provider": "openai",
        "model": "gpt-4o",
        "input_per_mtok": "3",
        "output_per_mtok": "12",
        "per_request": "0",
        "tool_fees": "{}",
        "tiers": "[]",
        "daily_spans": "[]",
        "source": "manual",
        "reason": "list price",
    }
    return client.post(reverse("admin:llm_budgets_price_add"), data)


def _change_tenant(client: Client, tenant: Tenant) -> Any:
    data = {"name": "Acme Corp", "timezone": "Europe/Paris", "billing_day": "1"}
    return client.post(reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]), data)


def _add_api_key(client: Client, tenant: Tenant) -> Any:
    data = {"name": "ci", "tenant": tenant.pk, "expiry_date": ""}
    return client.post(reverse("admin:llm_budgets_apikey_add"), data)


def _revoke_api_key(client: Client, tenant: Tenant) -> Any:
    api_key, _ = api_key_create(tenant=tenant.external_id, name="old")
    data = {"action": "revoke", "_selected_action": [api_key.pk]}
    return client.post(reverse("admin:llm_budgets_apikey_changelist"), data)


ACTIONS: list[tuple[str, Action, str, str]] = [
    # (name, perform, the permission it needs, the audit event it leaves)
    ("trip a kill switch", _trip, "add_killswitch", "kill_switch.trip"),
    ("clear a kill switch", _clear, "change_killswitch", "kill_switch.clear"),
    ("grant a raise", _raise, "add_budgetraise", "budget.raise"),
    ("reset an end user", _reset, "reset_spend", "end_user.reset_spend"),
    ("void a line", _void, "void_usagerecord", "usage.void"),
    ("change a limit", _change_limit, "change_budget", "budget.change_limit"),
    ("add a budget", _add_budget, "add_budget", "budget.create"),
    ("add a price version", _add_price, "add_price", "price.set"),
    ("change a tenant", _change_tenant, "change_tenant", "tenant.update"),
    ("create an API key", _add_api_key, "add_apikey", "api_key.create"),
    ("revoke an API key", _revoke_api_key, "change_apikey", "api_key.revoke"),
]


@pytest.mark.parametrize(
    ("perform", "permission", "event"), [a[1:] for a in ACTIONS], ids=[a[0] for a in ACTIONS]
)
def test_each_action_needs_its_permission_and_is_audited_with_the_persons_name(
    acme: Tenant, perform: Action, permission: str, event: str
) -> None:
    # Everything but this one permission: refused, nothing written.
    without = _client("without", _all_but(permission))
    before = AuditEvent.objects.filter(action=event).count()
    response = perform(without, acme)
    # A changelist action the person may not use is not offered: the list shows again.
    assert response.status_code == (200 if permission == "change_apikey" else 403)
    assert AuditEvent.objects.filter(action=event).count() == before
    # Only the view permissions and this one: done, and the audit log names the person.
    allowed = _client("maria", _view_all() | {permission})
    response = perform(allowed, acme)
    assert response.status_code == 302, response.content.decode()[:2000]
    done = AuditEvent.objects.filter(action=event).exclude(actor="").latest("pk")
    assert done.actor == "maria"


# --- item 1 and 2: money and time on the screens ------------------------------------------------


def test_price_detail_shows_rates_with_their_unit_not_raw_decimals(superuser: Client) -> None:
    budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok=Decimal("0.8"),
        output_per_mtok=Decimal("0.0416666666"),
    )
    price = Price.objects.get(model="gpt-4o")
    html = superuser.get(reverse("admin:llm_budgets_price_change", args=[price.pk])).content
    text = html.decode()
    assert "0.800000000000000000" not in text
    assert "0.80 USD / 1M tokens" in text
    assert "0.04166667 USD / 1M tokens" in text
    assert 'title="exact: 0.0416666666 USD"' in text


def test_tenant_timezone_is_chosen_from_a_list(superuser: Client, acme: Tenant) -> None:
    page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    widget = page.context["adminform"].form.fields["timezone"].widget
    assert ("Europe/Amsterdam", "Europe/Amsterdam") in [(v, v) for v, _ in widget.choices]
    assert '<select name="timezone"' in page.content.decode()


def test_times_on_a_tenants_screens_are_in_its_timezone_and_labelled(
    superuser: Client, acme: Tenant
) -> None:
    budget = Budget.objects.get(scope=Scope.END_USER)
    page = superuser.get(reverse("admin:llm_budgets_budget_change", args=[budget.pk]))
    periods = strip_tags(page.content.decode())
    assert "UTC" not in periods.split("Recent periods")[1][:200]
    assert "CET" in periods.split("Recent periods")[1][:200]
    assert "not retroactive" in periods  # a budget counts from when it was created


# --- item 3 and 5: lists that say whose and how much ---------------------------------------------


def test_budget_list_shows_this_periods_spent_remaining_and_raises(
    superuser: Client, acme: Tenant
) -> None:
    own = Budget.objects.get(scope=Scope.END_USER)
    _grant(own)
    page = superuser.get(reverse("admin:llm_budgets_budget_changelist"))
    row = next(
        " ".join(strip_tags(r).split())
        for r in page.content.decode().split("<tr")
        if "acme/u-1" in r
    )
    assert "75.00 USD, of which 25.00 USD until" in row
    assert "30.00 USD" in row  # spent this period
    assert "45.00 USD" in row  # remaining: 75 - 30


def _grant(budget: Budget) -> None:
    from llm_budgets.control.raises import budget_raise_grant

    budget_raise_grant(
        budget=budget,
        amount=Decimal("25"),
        until=timezone.now() + timedelta(days=2),
        reason="launch",
        actor="maria",
    )


def test_counters_say_whose_they_are(superuser: Client, acme: Tenant) -> None:
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("80"), window="day")
    reserve_30(end_user="u-2").release()
    page = superuser.get(reverse("admin:llm_budgets_counter_changelist"))
    assert page.status_code == 200
    text = page.content.decode()
    u2 = EndUser.objects.get(external_id="u-2")
    assert reverse("admin:llm_budgets_enduser_change", args=[u2.pk]) in text


def test_a_voided_line_says_so_and_its_compensating_line_says_why_and_who(
    superuser: Client, acme: Tenant
) -> None:
    line = UsageRecord.objects.get()
    usage_void(record_id=line.pk, reason="refunded", actor="maria")
    tenant_page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    rows = {r["id"]: r for r in tenant_page.context["line_rows"]}
    assert rows[line.pk]["voided"]
    assert rows[line.pk]["void_url"] is None  # no void link on a voided line
    [compensating] = [r for r in rows.values() if r["id"] != line.pk]
    assert compensating["status"] == f"voids line {line.pk}: “refunded” by maria"
    ledger = superuser.get(reverse("admin:llm_budgets_usagerecord_changelist"))
    text = strip_tags(ledger.content.decode())
    assert f"voided by line {compensating['id']}" in " ".join(text.split())
    assert "“refunded” by maria" in text
    detail = superuser.get(reverse("admin:llm_budgets_usagerecord_change", args=[line.pk]))
    assert "voided" in detail.content.decode()
    void_url = reverse("admin:llm_budgets_tenant_void_line", args=[acme.pk, line.pk])
    assert void_url not in detail.content.decode()  # voided: no void link


def test_a_charge_can_be_voided_from_its_ledger_page(superuser: Client, acme: Tenant) -> None:
    line = UsageRecord.objects.get()
    page = superuser.get(reverse("admin:llm_budgets_usagerecord_change", args=[line.pk]))
    void_url = reverse("admin:llm_budgets_tenant_void_line", args=[acme.pk, line.pk])
    assert void_url in page.content.decode()
    viewer = _client("viewer", _view_all())
    page = viewer.get(reverse("admin:llm_budgets_usagerecord_change", args=[line.pk]))
    assert void_url not in page.content.decode()


def test_identical_refusals_in_a_burst_are_grouped_with_a_count(
    superuser: Client, acme: Tenant
) -> None:
    for _ in range(4):  # u-1 has 20 left of 50: a worst case of 30 is refused each time
        with pytest.raises(BudgetExceeded):
            reserve_30(end_user="u-1")
    page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    [group] = page.context["refusal_rows"]
    assert group["count"] == 4
    assert (strip_tags(group["requested"]), strip_tags(group["remaining"])) == (
        "30.00 USD",
        "20.00 USD",
    )
    refusals = superuser.get(reverse("admin:llm_budgets_refusal_changelist"))
    text = " ".join(strip_tags(refusals.content.decode()).split())
    assert "30.00 USD" in text  # asked
    assert "20.00 USD" in text  # left
    assert "Resets" in text


# --- item 4: actions that say what they do -------------------------------------------------------


def test_forms_opened_from_a_tenant_page_come_prefilled(superuser: Client, acme: Tenant) -> None:
    page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    tenant_budget = Budget.objects.get(scope=Scope.TENANT)
    [row] = [r for r in page.context["budget_rows"] if r["scope"] == "tenant acme"]
    raise_form = superuser.get(row["raise_url"])
    assert raise_form.context["adminform"].form.initial["budget"] == str(tenant_budget.pk)
    html = raise_form.content.decode()
    assert 'value="Grant the raise"' in html
    assert "_addanother" not in html
    assert "Europe/Amsterdam" in html  # times are entered in the tenant's timezone
    offset = timezone.now().astimezone(ZoneInfo("Europe/Amsterdam")).utcoffset()
    assert offset is not None
    # ... and the pickers' "Now" shortcut fills in the time in that zone too.
    assert f'data-admin-utc-offset="{int(offset.total_seconds())}"' in html
    assert "fa-pencil" not in html
    assert 'id="change_id_budget"' not in html  # no edit / add / view icons beside the budget
    assert "Required. Why the raise; kept in the audit log." in html  # not the refusal's text
    trip_url = dict(page.context["control_actions"])["Trip a kill switch on this tenant"]
    trip = superuser.get(trip_url)
    assert trip.context["adminform"].form.initial["tenant"] == str(acme.pk)


def test_trip_message_names_what_happened(superuser: Client, acme: Tenant) -> None:
    response = superuser.post(
        reverse("admin:llm_budgets_killswitch_add"),
        {"tenant": acme.pk, "reason": "abuse", "_save": "1"},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == ["Kill switch on tenant acme tripped."]
    assert response.redirect_chain[-1][0] == reverse(
        "admin:llm_budgets_tenant_change", args=[acme.pk]
    )
    switch = KillSwitch.objects.get()
    page = superuser.get(reverse("admin:llm_budgets_killswitch_change", args=[switch.id]))
    html = page.content.decode()
    assert "Clear this switch" in html
    assert 'name="_save"' not in html  # not a generic change form


# --- item 6: a page per end user -----------------------------------------------------------------


def test_end_user_page_shows_where_they_stand_and_is_reachable(
    superuser: Client, acme: Tenant
) -> None:
    u1 = EndUser.objects.get(external_id="u-1")
    held = reserve_30(end_user="u-1", max_output_tokens=500)  # 15 held
    with pytest.raises(BudgetExceeded):
        reserve_30(end_user="u-1")
    budgets.trip(reason="provider incident")  # a global switch covers u-1 too
    url = reverse("admin:llm_budgets_enduser_change", args=[u1.pk])
    page = superuser.get(url)
    assert page.status_code == 200
    rows = {r["scope"]: r for r in page.context["budget_rows"]}
    own = rows["end user acme/u-1"]
    assert [strip_tags(own[k]) for k in ("spent", "reserved", "remaining")] == [
        "30.00 USD",
        "15.00 USD",
        "5.00 USD",
    ]
    assert "tenant acme" in rows  # the tenant's budget applies to them too
    assert [r["full_id"] for r in page.context["reservation_rows"]] == [str(held.id)]
    assert len(page.context["line_rows"]) == 1
    assert page.context["refusal_rows"][0]["end_user"] == "u-1"
    assert [s["scope"] for s in page.context["switch_rows"]] == ["global"]
    actions = dict(page.context["control_actions"])
    assert "end_user_id=u-1" in actions["Trip a kill switch on this end user"]
    assert "end_user=u-1" in actions["Reset this end user's period spend"]
    assert own["raise_url"].endswith(f"budget={Budget.objects.get(end_user=u1).pk}")
    # Reachable from the tenant page, the refusals list, the ledger and a search box.
    tenant_page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    assert url in tenant_page.content.decode()
    for listing in ("refusal", "usagerecord"):
        assert (
            url
            in superuser.get(reverse(f"admin:llm_budgets_{listing}_changelist")).content.decode()
        )
    found = superuser.get(
        reverse("admin:llm_budgets_enduser_changelist"), {"q": "u-1", "tenant__id__exact": acme.pk}
    )
    assert url in found.content.decode()


def test_end_user_page_query_count_is_fixed(superuser: Client, acme: Tenant) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    u1 = EndUser.objects.get(external_id="u-1")
    url = reverse("admin:llm_budgets_enduser_change", args=[u1.pk])
    superuser.get(url)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert superuser.get(url).status_code == 200
        return len(queries)

    small = count()
    for _ in range(5):
        reserve_30(end_user="u-1", max_output_tokens=10).commit(input_tokens=0, output_tokens=5)
    assert count() == small


# --- item 7: housekeeping ------------------------------------------------------------------------


def test_one_api_keys_entry() -> None:
    from rest_framework_api_key.models import APIKey

    assert not admin.site.is_registered(APIKey)
    assert admin.site.is_registered(ApiKey)


def test_view_site_goes_to_the_usage_pages_where_support_picks_a_tenant() -> None:
    budgets.ensure_tenant(tenant="acme", name="Acme Corp")
    budgets.ensure_tenant(tenant="beta")
    support = _client("sue", _view_all())  # the support role's view permissions
    index = support.get(reverse("admin:index")).content.decode()
    assert f'href="{reverse("llm_budgets_pages:overview")}">View site' in index
    # No tenant of their own: the usage pages offer the tenants (searchable), not a 403.
    picker = support.get(reverse("llm_budgets_pages:overview"))
    assert picker.status_code == 200
    text = picker.content.decode()
    assert 'href="/usage/?tenant=acme">Acme Corp</a>' in text
    assert 'href="/usage/?tenant=beta">beta</a>' in text
    found = support.get(reverse("llm_budgets_pages:tenants"), {"q": "acm"}).content.decode()
    assert "?tenant=acme" in found
    assert "?tenant=beta" not in found
    # A page asked for keeps its path: the picker links to it.
    assert "/usage/users/?tenant=beta" in support.get("/usage/users/").content.decode()
    # The admin tenant page links to the tenant's usage pages, which open for support.
    acme = Tenant.objects.get(external_id="acme")
    page = support.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    assert 'href="/usage/?tenant=acme">Usage pages</a>' in page.content.decode()
    overview = support.get("/usage/", {"tenant": "acme"}).content.decode()
    assert "Support view of this tenant." in overview
    assert "Choose another tenant" in overview


def test_the_tenant_picker_is_for_support_staff_only() -> None:
    budgets.ensure_tenant(tenant="acme")
    client = _client("stan", set())  # staff, without the view permission on tenants
    assert client.get(reverse("llm_budgets_pages:tenants")).status_code == 403
    assert client.get(reverse("llm_budgets_pages:overview")).status_code == 403
    assert Client().get(reverse("llm_budgets_pages:tenants")).status_code == 302


def test_plan_form_shows_an_empty_box_not_null(superuser: Client) -> None:
    plan = Plan.objects.create(name="pro")
    page = superuser.get(reverse("admin:llm_budgets_plan_change", args=[plan.pk]))
    html = page.content.decode()
    assert ">null</textarea>" not in html
    assert "Empty: the site's default, [50, 80, 100]." in html


def test_a_budget_created_mid_period_says_from_when_it_counts(
    superuser: Client, acme: Tenant
) -> None:
    old = Budget.objects.get(scope=Scope.TENANT)
    Budget.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=400))
    page = superuser.get(reverse("admin:llm_budgets_tenant_change", args=[acme.pk]))
    [tenant_row] = [r for r in page.context["budget_rows"] if r["scope"] == "tenant acme"]
    assert tenant_row["counts_from"] == ""  # older than the period: counts all of it
    [own] = page.context["end_user_budget_rows"]
    own_budget = Budget.objects.get(scope=Scope.END_USER)
    assert own["counts_from"] == when(own_budget.created_at, "Europe/Amsterdam")
    assert "counts from" in page.content.decode()


def test_an_end_user_on_the_each_end_user_budget_gets_an_own_budget_prefilled(
    superuser: Client, acme: Tenant
) -> None:
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("8"), window="day")
    u1 = EndUser.objects.get(external_id="u-1")
    page = superuser.get(reverse("admin:llm_budgets_enduser_change", args=[u1.pk]))
    [shared] = [r for r in page.context["budget_rows"] if r["scope"] == "end user acme/*"]
    assert shared["raise_url"] == ""  # a raise on "*" would raise every end user
    form = superuser.get(shared["own_budget_url"]).context["adminform"].form
    assert {k: form.initial[k] for k in ("scope", "tenant", "end_user", "window", "limit")} == {
        "scope": Scope.END_USER,
        "tenant": str(acme.pk),
        "end_user": str(u1.pk),
        "window": "day",
        "limit": "8.00",
    }


def test_a_limit_change_says_what_changed(superuser: Client, acme: Tenant) -> None:
    budget = Budget.objects.get(scope=Scope.TENANT)
    response = superuser.post(
        reverse("admin:llm_budgets_budget_change", args=[budget.pk]),
        {"limit": "1500", "reason": "upgrade", "_save": "1"},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == [
        "Limit of tenant acme's month budget set to 1,500.00 USD (was 100.00 USD)."
    ]


def _refusals_at(tenant: Tenant, rows: list[tuple[str, int]]) -> None:
    """Refusals of ``(end user, minutes ago)``, identical but for their end user and time."""
    now = timezone.now()
    for end_user, minutes in rows:
        Refusal.objects.create(
            created_at=now - timedelta(minutes=minutes),
            tenant=tenant,
            end_user=EndUser.objects.get_or_create(tenant=tenant, external_id=end_user)[0],
            end_user_external_id=end_user,  # as admission records it (issue #22.9)
            provider="openai",
            model="gpt-4o",
            kind=RefusalKind.BUDGET,
            detail="end user acme/* day budget, limit 2.00 USD",
            requested=Decimal("2.84"),
            remaining=Decimal("1.50"),
        )


def test_the_refusals_list_groups_a_burst_with_a_count(acme: Tenant, superuser: Client) -> None:
    # bob: 5 within minutes of each other (alice's in between does not break it), then one
    # 40 minutes earlier (a burst of its own); alice: one.
    _refusals_at(acme, [("bob", 1), ("bob", 3), ("alice", 4), ("bob", 9), ("bob", 15)])
    _refusals_at(acme, [("bob", 20), ("bob", 60)])
    url = reverse("admin:llm_budgets_refusal_changelist")

    def rows(**params: str) -> list[tuple[str, int]]:
        found = superuser.get(url, params).context["cl"].result_list
        return [(r.end_user.external_id, getattr(r, "burst_count", 1)) for r in found]

    assert rows() == [("bob", 5), ("alice", 1), ("bob", 1)]
    page = superuser.get(url).content.decode()
    assert "&times;5" in page
    assert "Grouped, with a count" in page
    # Each refusal on its own row when asked; search, filters and sorting work on the bursts.
    assert len(rows(bursts="each")) == 7
    assert rows(q="alice") == [("alice", 1)]
    assert rows(kind__exact="kill_switch") == []
    count_column = "1"  # list_display[1]
    assert [c for _, c in rows(o=f"-{count_column}")] == [5, 1, 1]
    assert rows(o=count_column)[-1] == ("bob", 5)
    # The burst's row opens the newest refusal; its own page is of that one refusal.
    newest = Refusal.objects.filter(end_user__external_id="bob").order_by("-created_at").first()
    assert newest is not None
    detail = superuser.get(reverse("admin:llm_budgets_refusal_change", args=[newest.pk]))
    assert detail.status_code == 200
