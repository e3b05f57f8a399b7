"""The admin's API key, run and tag budgets (issue #16): on the tenant and end-user pages, added
from a form pre-filled from the tenant page, raised, and reset through the adjustments service;
each action with and without its permission, audited with the person."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.control.api_keys import api_key_create
from llm_budgets.engine.admission import reservation_create
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    ApiKey,
    AuditEvent,
    Budget,
    Counter,
    EndUser,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed

pytestmark = pytest.mark.django_db


def _client(username: str, codenames: set[str]) -> Client:
    user = get_user_model().objects.create_user(username=username, password=None, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="llm_budgets", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def _view_all() -> set[str]:
    every = Permission.objects.filter(
        content_type__app_label="llm_budgets", codename__startswith="view_"
    )
    return set(every.values_list("codename", flat=True))


@pytest.fixture
def acme() -> Tenant:
    """acme (1000 a month) with a tag budget, a key budget, an each-run budget and a run of
    alice's that spent 30 under all of them."""
    seed(limit="1000")
    key, _ = api_key_create(tenant="acme", name="integration")
    budgets.set_limit(tenant="acme", tag=("project", "alpha"), amount=Decimal(50), window="month")
    budgets.set_limit(tenant="acme", api_key=key.prefix, amount=Decimal(40), window="month")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal(35), window="lifetime")
    _spend_30("alice", run="run-42", tags={"project": "alpha"}, api_key=key)
    return Tenant.objects.get(external_id="acme")


def _spend_30(end_user: str, **scopes: Any) -> None:
    """A committed call of 30 (the fixture price) for ``end_user`` naming ``scopes``."""
    hold = reservation_create(
        tenant="acme",
        end_user=end_user,
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        **scopes,
    )
    budgets.commit(hold.pk, input_tokens=0, output_tokens=1000)


def _tenant_page(client: Client, tenant: Tenant) -> str:
    return client.get(reverse("admin:llm_budgets_tenant_change", args=[tenant.pk])).content.decode()


def test_the_tenant_page_shows_key_run_and_tag_budgets_with_their_actions(acme: Tenant) -> None:
    billing = _client("bill", _view_all() | {"add_budget", "add_budgetraise", "reset_spend"})
    page = _tenant_page(billing, acme)
    section = page[page.index('id="llmb-scoped-budgets"') :]
    key = ApiKey.objects.get(name="integration")
    assert "tag project=alpha of acme" in section
    assert f"API key {key.prefix}" in section
    assert "run run-42 of acme" in section  # its share of the each-run budget
    tag = Budget.objects.get(scope=Scope.TAG)
    assert reverse("admin:llm_budgets_tenant_reset_budget", args=[acme.pk, tag.pk]) in section
    assert f"budget={tag.pk}" in section  # Raise…
    add = f"{reverse('admin:llm_budgets_budget_add')}?tenant={acme.pk}&amp;scope=tag"
    assert add in page
    # Without the permissions: the budgets, and no link to act on them.
    support = _client("sue", _view_all())
    page = _tenant_page(support, acme)
    assert "tag project=alpha of acme" in page
    assert "reset-budget" not in page
    assert "Add an API key, run or tag budget" not in page


def test_the_end_user_page_lists_their_runs(acme: Tenant) -> None:
    alice = EndUser.objects.get(external_id="alice")
    client = _client("sue", _view_all())
    page = client.get(reverse("admin:llm_budgets_enduser_change", args=[alice.pk])).content.decode()
    section = page[page.index('id="llmb-runs"') :]
    assert "run run-42 of acme" in section
    assert "30.00 USD" in section  # spent under the each-run budget
    assert "5.00 USD" in section  # remaining of its 35


@pytest.mark.parametrize(
    ("scope", "fields", "expect"),
    [
        ("tag", {"tag_key": "project", "tag_value": "beta"}, "tag project=beta of acme"),
        ("run", {"run_id": "run-7"}, "run run-7 of acme"),
        ("api_key_default", {}, "API key * of acme"),
    ],
)
def test_a_key_run_or_tag_budget_is_added_from_the_form(
    acme: Tenant, scope: str, fields: dict[str, str], expect: str
) -> None:
    billing = _client("bill", _view_all() | {"add_budget"})
    add = reverse("admin:llm_budgets_budget_add")
    form = billing.get(add, {"tenant": acme.pk, "scope": "tag"}).content.decode()
    assert 'option value="tag" selected' in form  # pre-filled from the tenant page's link
    data = {"scope": scope, "tenant": acme.pk, "window": "month", "limit": "12", **fields}
    response = billing.post(add, {**data, "reason": "launch"})
    assert response.status_code == 302, response.content.decode()[:2000]
    budget = Budget.objects.get(scope=scope, limit=Decimal(12))
    assert budget.scope_label == expect
    event = AuditEvent.objects.get(action="budget.create", target__contains=expect)
    assert event.actor == "bill"
    # Without add_budget: 403, nothing written.
    viewer = _client("sue", _view_all())
    assert viewer.post(add, {**data, "limit": "13"}).status_code == 403
    assert not Budget.objects.filter(limit=Decimal(13)).exists()


def test_the_key_budget_form_names_a_key_of_the_tenant(acme: Tenant) -> None:
    billing = _client("bill", _view_all() | {"add_budget"})
    add = reverse("admin:llm_budgets_budget_add")
    other, _ = api_key_create(tenant=None, name="operator")
    budgets.ensure_tenant(tenant="beta")
    beta_key, _ = api_key_create(tenant="beta", name="beta's")
    base = {"scope": "api_key", "tenant": acme.pk, "window": "day", "limit": "3"}
    refused = billing.post(add, {**base, "api_key_prefix": beta_key.prefix})
    assert "No API key with prefix" in refused.content.decode()
    missing = billing.post(add, {**base})
    assert "needs the API key" in missing.content.decode()
    extra = billing.post(add, {**base, "api_key_prefix": other.prefix, "run_id": "r"})
    assert "takes no Run" in extra.content.decode()
    assert not Budget.objects.filter(window="day").exists()
    assert billing.post(add, {**base, "api_key_prefix": other.prefix}).status_code == 302
    assert Budget.objects.get(window="day").api_key == other


def test_a_tag_budget_is_reset_audited_and_conserved(acme: Tenant) -> None:
    tag = Budget.objects.get(scope=Scope.TAG)
    url = reverse("admin:llm_budgets_tenant_reset_budget", args=[acme.pk, tag.pk])
    # Without reset_spend: 403 and nothing written.
    assert _client("sue", _view_all()).post(url, {"reason": "x"}).status_code == 403
    assert not UsageRecord.objects.filter(kind=UsageKind.ADJUSTMENT).exists()
    billing = _client("bill", _view_all() | {"reset_spend"})
    assert "Reason" in billing.get(url).content.decode()
    response = billing.post(url, {"reason": "project alpha re-scoped"}, follow=True)
    text = response.content.decode()
    assert "Period spend of tag project=alpha of acme&#x27;s month budget reset" in text
    counter = Counter.objects.get(budget=tag)
    assert counter.spent == 0
    # Only the tag's counter: the tenant's and the key's budgets keep the spend.
    assert Counter.objects.get(budget__scope=Scope.TENANT).spent > 0
    assert Counter.objects.get(budget__scope=Scope.API_KEY).spent > 0
    event = AuditEvent.objects.get(action="budget.reset_spend")
    assert event.actor == "bill"
    assert event.reason == "project alpha re-scoped"
    assert counters_drift() == []
    # The tenant page explains the compensating line: what, why, who.
    assert "project alpha re-scoped" in _tenant_page(billing, acme)


def test_an_each_key_budget_is_reset_for_one_key(acme: Tenant) -> None:
    key = ApiKey.objects.get(name="integration")
    budgets.set_limit(tenant="acme", api_key=key.prefix, amount=Decimal(100), window="month")
    # Its own month budget replaces "*" for the month: the each-key budget is a day one.
    budgets.set_limit(tenant="acme", api_key="*", amount=Decimal(45), window="day")
    _spend_30("bob", api_key=key)
    each = Budget.objects.get(scope=Scope.API_KEY_DEFAULT)
    billing = _client("bill", _view_all() | {"reset_spend"})
    page = _tenant_page(billing, acme)
    url = reverse("admin:llm_budgets_tenant_reset_budget", args=[acme.pk, each.pk])
    assert f"{url}?api_key={key.prefix}" in page
    assert "API key" in billing.post(url, {"reason": "x"}).content.decode()  # required
    unknown = billing.post(url, {"reason": "x", "api_key": "nope"}).content.decode()
    assert "No API key with prefix" in unknown
    billing.post(url, {"reason": "rotated", "api_key": key.prefix})
    assert Counter.objects.get(budget=each, api_key=key).spent == 0
    assert counters_drift() == []
