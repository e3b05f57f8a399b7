"""The admin (issue 2 item E): every model registered, the ledger read-only, writes through the
services (audited), and the tenant page showing where each budget stands."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from llm_budgets import budgets, clock
from llm_budgets.admin.ledger import ReservationAdmin, ReservationHoldInline
from llm_budgets.jobs.rollups import daily_usage_refresh
from llm_budgets.jobs.thresholds import thresholds_scan
from llm_budgets.models import (
    AuditEvent,
    Budget,
    Counter,
    DailyUsage,
    EndUser,
    Plan,
    Price,
    Reservation,
    ReservationHold,
    Scope,
    Tenant,
    ThresholdCrossing,
    UsageRecord,
)
from llm_budgets.reads import overviews as admin_selectors
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed

pytestmark = pytest.mark.django_db

READ_ONLY_MODELS = [Counter, Reservation, UsageRecord, AuditEvent, ThresholdCrossing, DailyUsage]
ALL_MODELS = [Plan, Tenant, EndUser, Budget, Price, *READ_ONLY_MODELS]


def _url(model: type, action: str, *args: object) -> str:
    return reverse(f"admin:llm_budgets_{model._meta.model_name}_{action}", args=args)


@pytest.fixture
def ledger() -> dict[str, object]:
    """acme capped at 100 a month, each end user at 80 a day, u-1 at 40 a month of its own;
    one hold of 30 open for u-1, and one call of u-2 committed at 15."""
    seed(limit="100")
    Tenant.objects.filter(external_id="acme").update(plan=Plan.objects.create(name="pro"))
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal("80"), window="day")
    budgets.set_limit(tenant="acme", end_user="u-1", amount=Decimal("40"), window="month")
    held = reserve_30(end_user="u-1")
    reserve_30(end_user="u-2").commit(input_tokens=0, output_tokens=500)
    # What the jobs write: a warning crossing (45 of 100 reaches a 40 % threshold) and rollups.
    Budget.objects.filter(scope=Scope.TENANT).update(warning_thresholds=[40])
    thresholds_scan()
    daily_usage_refresh()
    return {"tenant": Tenant.objects.get(external_id="acme"), "held": held}


def _logged_in(**fields: object) -> Client:
    # No password: hashing one costs most of a test's time, and force_login needs none.
    user = get_user_model().objects.create_user(password=None, **fields)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client() -> Client:
    """A superuser named ``admin`` (overrides pytest-django's, which hashes a password)."""
    return _logged_in(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def staff_client() -> Client:
    """A staff member with no permission at all."""
    return _logged_in(username="staff", is_staff=True)


def test_every_model_is_registered() -> None:
    for model in ALL_MODELS:
        assert admin.site.is_registered(model), model
    # Holds are shown on their reservation's page.
    assert ReservationHoldInline in ReservationAdmin.inlines
    assert ReservationHoldInline.model is ReservationHold


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_changelist_search_and_change_page_render(admin_client: Client, model: type) -> None:
    assert admin_client.get(_url(model, "changelist")).status_code == 200
    assert admin_client.get(_url(model, "changelist"), {"q": "acme"}).status_code == 200
    obj = model._default_manager.first()
    assert obj is not None
    assert admin_client.get(_url(model, "change", obj.pk)).status_code == 200


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_staff_without_permissions_is_refused(staff_client: Client, model: type) -> None:
    obj = model._default_manager.first()
    assert staff_client.get(_url(model, "changelist")).status_code == 403
    assert staff_client.get(_url(model, "change", obj.pk)).status_code == 403
    assert staff_client.get(_url(model, "add")).status_code == 403


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("model", READ_ONLY_MODELS, ids=lambda m: m.__name__)
def test_read_only_models_refuse_add_change_delete(admin_client: Client, model: type) -> None:
    obj = model._default_manager.first()
    before = model._default_manager.values().get(pk=obj.pk)
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.get(_url(model, "delete", obj.pk)).status_code == 403
    assert admin_client.post(_url(model, "change", obj.pk), {"_save": "1"}).status_code == 403
    page = admin_client.get(_url(model, "change", obj.pk)).content.decode()
    assert 'name="_save"' not in page
    changelist = admin_client.get(_url(model, "changelist")).content.decode()
    assert _url(model, "add") not in changelist
    assert "delete_selected" not in changelist
    assert model._default_manager.values().get(pk=obj.pk) == before


@pytest.mark.usefixtures("ledger")
@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_view_permission_alone_shows_pages_without_save(staff_client: Client, model: type) -> None:
    user = get_user_model().objects.get(username="staff")
    user.user_permissions.add(Permission.objects.get(codename=f"view_{model._meta.model_name}"))
    obj = model._default_manager.first()
    assert staff_client.get(_url(model, "changelist")).status_code == 200
    page = staff_client.get(_url(model, "change", obj.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert staff_client.post(_url(model, "change", obj.pk), {"_save": "1"}).status_code == 403


def test_tenant_page_shows_current_period_numbers_and_open_holds(
    admin_client: Client, ledger: dict[str, object]
) -> None:
    tenant = ledger["tenant"]
    page = admin_client.get(_url(Tenant, "change", tenant.pk))  # type: ignore[attr-defined]
    assert page.status_code == 200
    rows = {(r["scope"], r["window"]): r for r in page.context["budget_rows"]}
    tenant_month = rows[("tenant acme", "month")]
    assert strip_tags(tenant_month["limit"]) == "100.00 USD"
    assert strip_tags(tenant_month["spent"]) == "15.00 USD"
    assert strip_tags(tenant_month["reserved"]) == "30.00 USD"
    assert strip_tags(tenant_month["remaining"]) == "55.00 USD"
    assert tenant_month["resets_at"]
    assert ("end user acme/*", "day") in rows
    [own] = page.context["end_user_budget_rows"]
    assert (
        own["scope"],
        strip_tags(own["limit"]),
        strip_tags(own["reserved"]),
        strip_tags(own["remaining"]),
    ) == (
        "end user acme/u-1",
        "40.00 USD",
        "30.00 USD",
        "10.00 USD",
    )
    [open_row] = page.context["reservation_rows"]
    held = ledger["held"]
    assert open_row["full_id"] == str(held.id)  # type: ignore[attr-defined]
    assert open_row["id"] == str(held.id)[:8]  # type: ignore[attr-defined]
    assert strip_tags(open_row["amount"]) == "30.00 USD"
    html = page.content.decode()
    for text in ["55.00 USD", "30.00 USD", str(held.id), "Open reservations (1)"]:  # type: ignore[attr-defined]
        assert text in html
    # An uncertain hold is still counted, so it is still open.
    held.mark_uncertain()  # type: ignore[attr-defined]
    page = admin_client.get(_url(Tenant, "change", tenant.pk))  # type: ignore[attr-defined]
    assert [r["full_id"] for r in page.context["reservation_rows"]] == [str(held.id)]  # type: ignore[attr-defined]
    assert admin_client.get(page.context["open_reservations_url"]).status_code == 200


def test_tenant_page_query_count_does_not_grow_with_the_tenant(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_selectors, "TENANT_PAGE_ROWS", 5)
    seed(limit="100000")
    tenant = Tenant.objects.get(external_id="acme")
    url = _url(Tenant, "change", tenant.pk)

    def grow_to(end_users: int) -> int:
        for i in range(EndUser.objects.filter(tenant=tenant).count(), end_users):
            budgets.set_limit(tenant="acme", end_user=f"u-{i}", amount=Decimal("90"), window="day")
            reserve_30(end_user=f"u-{i}")
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(url)
        assert page.status_code == 200
        assert len(page.context["reservation_rows"]) == min(end_users, 5)
        return len(queries)

    admin_client.get(url)  # warm the per-process caches (content types) out of the count
    small = grow_to(2)
    large = grow_to(12)
    assert large == small, (small, large)
    # 11 + open switches, recent refusals, recent ledger lines, voided lines among them, raises;
    # + 4 for the Stripe billing panel (link, outbox waiting, deliveries by state, last run);
    # + 1 for the key/run/tag budgets; + 1 for the billing contacts (their email endpoint)
    assert large <= 22, large
    html = admin_client.get(url).content.decode()
    assert "All 12 open reservations" in html
    assert "All 12 end-user budgets" in html


def test_budget_limit_change_goes_through_the_service_and_is_audited(
    admin_client: Client, ledger: dict[str, object]
) -> None:
    budget = Budget.objects.get(scope=Scope.TENANT, window="month")
    response = admin_client.post(
        _url(Budget, "change", budget.pk),
        {"limit": "150", "reason": "support ticket 42", "_save": "1"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    budget.refresh_from_db()
    assert budget.limit == Decimal("150")
    event = AuditEvent.objects.filter(action="budget.change_limit").get()
    assert event.actor == "admin"
    assert event.reason == "support ticket 42"
    assert event.tenant == ledger["tenant"]
    assert Decimal(event.before["limit"]) == 100
    assert Decimal(event.after["limit"]) == 150


def test_budget_change_cannot_move_its_scope(admin_client: Client) -> None:
    seed(limit="100")
    budget = Budget.objects.get()
    admin_client.post(
        _url(Budget, "change", budget.pk),
        {"limit": "100", "scope": Scope.GLOBAL, "window": "day", "tenant": "", "_save": "1"},
    )
    budget.refresh_from_db()
    assert (budget.scope, budget.window, budget.tenant_id) == (
        Scope.TENANT,
        "month",
        Tenant.objects.get().pk,
    )


def test_budget_add_goes_through_the_service(admin_client: Client) -> None:
    seed(limit="100")
    tenant = Tenant.objects.get()
    response = admin_client.post(
        _url(Budget, "add"),
        {"scope": Scope.END_USER_DEFAULT, "tenant": tenant.pk, "window": "day", "limit": "5"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    budget = Budget.objects.get(scope=Scope.END_USER_DEFAULT)
    assert (budget.tenant, budget.limit, budget.currency) == (tenant, Decimal(5), "USD")
    event = AuditEvent.objects.get(action="budget.create", tenant=tenant, actor="admin")
    assert "acme/*" in event.target


@pytest.mark.parametrize(
    ("scope", "window", "limit", "message"),
    [
        (Scope.END_USER, "day", "5", "needs an end user"),
        (Scope.GLOBAL, "day", "5", "takes no tenant"),
        (Scope.TENANT, "month", "5", "already exists"),
        (Scope.TENANT, "day", "-1", "greater than or equal to 0"),
    ],
)
def test_budget_add_refuses_what_the_scope_does_not_allow(
    admin_client: Client, scope: str, window: str, limit: str, message: str
) -> None:
    seed(limit="100")
    tenant = Tenant.objects.get()
    events = AuditEvent.objects.count()
    response = admin_client.post(
        _url(Budget, "add"), {"scope": scope, "tenant": tenant.pk, "window": window, "limit": limit}
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    assert Budget.objects.count() == 1
    assert AuditEvent.objects.count() == events


def test_tenant_add_and_change_go_through_tenant_ensure(admin_client: Client) -> None:
    plan = Plan.objects.create(name="pro")
    response = admin_client.post(
        _url(Tenant, "add"),
        {
            "external_id": "globex",
            "name": "Globex",
            "plan": plan.pk,
            "timezone": "UTC",
            "billing_day": "1",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant = Tenant.objects.get(external_id="globex")
    assert AuditEvent.objects.filter(action="tenant.create", tenant=tenant, actor="admin").exists()

    response = admin_client.post(
        _url(Tenant, "change", tenant.pk),
        {
            "external_id": "renamed",
            "name": "Globex Inc",
            "plan": plan.pk,
            "timezone": "Europe/Amsterdam",
            "billing_day": "15",
            "_save": "1",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant.refresh_from_db()
    assert (tenant.external_id, tenant.name, tenant.timezone, tenant.billing_day) == (
        "globex",  # the host's key is fixed once created
        "Globex Inc",
        "Europe/Amsterdam",
        15,
    )
    event = AuditEvent.objects.get(action="tenant.update", tenant=tenant)
    assert event.actor == "admin"
    assert event.before["timezone"] == "UTC"
    assert event.after["timezone"] == "Europe/Amsterdam"


def test_tenant_billing_contacts_are_edited_through_tenant_ensure(admin_client: Client) -> None:
    seed()
    tenant = Tenant.objects.get(external_id="acme")
    form = {"name": "Acme", "timezone": "UTC", "billing_day": "1", "_save": "1"}
    response = admin_client.post(
        _url(Tenant, "change", tenant.pk), {**form, "billing_emails": "not-an-address"}
    )
    assert response.status_code == 200  # the form shows the error
    assert "valid email" in response.content.decode()
    response = admin_client.post(
        _url(Tenant, "change", tenant.pk), {**form, "billing_emails": "a@acme.test\nb@acme.test"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant.refresh_from_db()
    assert tenant.billing_contacts == ["a@acme.test", "b@acme.test"]
    event = AuditEvent.objects.get(action="tenant.update", tenant=tenant)
    assert event.after["billing_emails"] == "a@acme.test\nb@acme.test"


def test_tenant_change_refuses_a_bad_timezone_and_a_cleared_plan(admin_client: Client) -> None:
    budgets.ensure_tenant(tenant="acme", timezone="UTC")
    tenant = Tenant.objects.get()
    tenant.plan = Plan.objects.create(name="pro")
    tenant.save()
    events = AuditEvent.objects.count()
    for data, message in [
        ({"timezone": "Mars/Olympus", "plan": tenant.plan.pk}, "not an IANA time zone"),
        ({"timezone": "UTC", "plan": ""}, "cannot be removed here"),
    ]:
        response = admin_client.post(
            _url(Tenant, "change", tenant.pk), {"name": "", "billing_day": "1", **data}
        )
        assert response.status_code == 200
        assert message in response.content.decode()
    tenant.refresh_from_db()
    assert (tenant.timezone, tenant.plan.name) == ("UTC", "pro")
    assert AuditEvent.objects.count() == events


def test_tenant_and_budget_cannot_be_deleted(admin_client: Client) -> None:
    seed(limit="100")
    tenant, budget = Tenant.objects.get(), Budget.objects.get()
    assert admin_client.post(_url(Tenant, "delete", tenant.pk), {"post": "yes"}).status_code == 403
    assert admin_client.post(_url(Budget, "delete", budget.pk), {"post": "yes"}).status_code == 403
    assert Budget.objects.filter(pk=budget.pk).exists()


def test_price_versions_are_added_through_the_service_never_changed(admin_client: Client) -> None:
    response = admin_client.post(
        _url(Price, "add"),
        {
            "provider": "openai",
            "model": "gpt-4o",
            "input_per_mtok": "2.50",
            "cached_input_per_mtok": "",
            "cache_write_per_mtok": "",
            "output_per_mtok": "10.00",
            "per_request": "0",
            "effective_from_0": "",
            "effective_from_1": "",
            "source": "manual",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    price = Price.objects.get(provider="openai")
    assert (price.input_per_mtok, price.output_per_mtok) == (Decimal("2.50"), Decimal("10.00"))
    assert AuditEvent.objects.filter(action="price.set", actor="admin").exists()

    page = admin_client.get(_url(Price, "change", price.pk)).content.decode()
    assert 'name="_save"' not in page
    response = admin_client.post(
        _url(Price, "change", price.pk), {"input_per_mtok": "0", "_save": "1"}
    )
    assert response.status_code == 403
    assert admin_client.post(_url(Price, "delete", price.pk), {"post": "yes"}).status_code == 403
    price.refresh_from_db()
    assert price.input_per_mtok == Decimal("2.50")
    changelist = admin_client.get(_url(Price, "changelist")).content.decode()
    for text in ["openai", "gpt-4o", "2.50 USD", "10.00 USD", "Manual"]:
        assert text in changelist


def test_end_user_add_goes_through_end_user_ensure(admin_client: Client) -> None:
    seed(limit="100")
    tenant = Tenant.objects.get()
    data = {"tenant": tenant.pk, "external_id": "u-9"}
    assert admin_client.post(_url(EndUser, "add"), data).status_code == 302
    assert EndUser.objects.get(tenant=tenant, external_id="u-9")
    assert admin_client.post(_url(EndUser, "add"), data).status_code == 200  # already there
    assert EndUser.objects.filter(tenant=tenant).count() == 1


def test_ledger_pages_show_money_with_currency(admin_client: Client) -> None:
    seed(limit="100")
    hold = reserve_30()
    hold.commit(input_tokens=0, output_tokens=500)
    page = admin_client.get(_url(Reservation, "change", hold.id)).content.decode()
    assert "30.00 USD" in page  # the hold
    assert "15.00 USD" in page  # its ledger line
    assert (
        f"{FAKE_PROVIDER}/{FAKE_MODEL}"
        in admin_client.get(_url(UsageRecord, "changelist")).content.decode()
    )


def test_tenant_page_shows_key_run_and_tag_budgets_and_each_runs_share(
    admin_client: Client,
) -> None:
    seed(limit="1000")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("100"), window="lifetime")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=Decimal("50"), window="month")
    reserve_30(run="run-1", tags={"project": "alpha"})
    reserve_30(run="run-2")
    reserve_30(run="run-2")
    tenant = Tenant.objects.get(external_id="acme")
    page = admin_client.get(_url(Tenant, "change", tenant.pk))
    rows = [(r["scope"], strip_tags(r["reserved"])) for r in page.context["scoped_budget_rows"]]
    assert rows == [
        ("tag project=alpha of acme", "30.00 USD"),
        ("run run-2 of acme", "60.00 USD"),
        ("run run-1 of acme", "30.00 USD"),
    ]
    assert "run run-2 of acme" in page.content.decode()


def test_a_run_or_tag_budgets_limit_changes_in_the_admin_on_that_budget(
    admin_client: Client,
) -> None:
    seed(limit="1000")
    tag = budgets.set_limit(
        tenant="acme", tag=("project", "alpha"), amount=Decimal("50"), window="month"
    )
    run = budgets.set_limit(tenant="acme", run="*", amount=Decimal("2"), window="lifetime")
    for result, limit in [(tag, "60"), (run, "3")]:
        response = admin_client.post(
            _url(Budget, "change", result.id), {"limit": limit, "reason": "ticket", "_save": "1"}
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        budget = Budget.objects.get(pk=result.id)
        assert budget.limit == Decimal(limit)
    # The tenant's own budget is untouched.
    assert Budget.objects.get(scope=Scope.TENANT).limit == Decimal("1000")


@pytest.mark.usefixtures("ledger")
def test_lists_show_the_staff_zone_and_a_row_its_tenants(admin_client: Client) -> None:
    """The one zone rule (docs/support.md): a list spans tenants, so its times are in the staff
    user's zone; a row's own page is the tenant's, in the tenant's zone. Labelled both ways."""
    Tenant.objects.filter(external_id="acme").update(timezone="Asia/Tokyo")
    line = UsageRecord.objects.get()
    listed = strip_tags(admin_client.get(_url(UsageRecord, "changelist")).content.decode())
    own = strip_tags(admin_client.get(_url(UsageRecord, "change", line.pk)).content.decode())
    assert clock.when(line.created_at, "UTC", seconds=True) in listed  # TIME_ZONE is UTC
    assert " JST" not in listed
    assert clock.when(line.created_at, "Asia/Tokyo", seconds=True) in own
    with timezone.override("America/New_York"):  # a host's per-user zone
        listed = strip_tags(admin_client.get(_url(UsageRecord, "changelist")).content.decode())
    assert clock.when(line.created_at, "America/New_York", seconds=True) in listed
