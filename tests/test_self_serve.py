"""Self-serve (issue #29): tenant admins change their own people's budgets, raises, keys and
alerts, through the services the support admin calls, checked in those services
(control/self_serve.py), within the operators' ceiling; members and other tenants cannot."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.alerts.self_serve import self_serve_subscribe
from llm_budgets.control.api_keys import api_key_create, api_key_revoke
from llm_budgets.control.limits import budget_remove, budget_set_limit
from llm_budgets.control.raises import budget_raise_grant, budget_raise_revoke
from llm_budgets.control.self_serve import TenantAdmin
from llm_budgets.engine.adjustments import end_user_spend_reset
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, SelfServeDenied
from llm_budgets.models import (
    AlertEndpoint,
    ApiKey,
    AuditEvent,
    Budget,
    BudgetRaise,
    EndUser,
    Plan,
    Scope,
    Tenant,
)
from tests.factories import reserve_30
from tests.pages import People, people, usage_data

pytestmark = pytest.mark.django_db

# Where a tenant admin's email addresses are sent their confirmation links.
SITE = {"confirm_site": "https://host.example/"}


@pytest.fixture
def folks(settings: Any) -> People:
    settings.LLM_BUDGETS = {**getattr(settings, "LLM_BUDGETS", {}), "ALERTS_ALLOW_HTTP": True}
    usage_data()
    found = people()
    Tenant.objects.filter(external_id__in=["acme", "beta"]).update(
        self_serve=True, self_serve_ceiling=Decimal(100)
    )
    return found


def admin_of(folks: People, tenant: str = "acme") -> TenantAdmin:
    user = folks.acme_admin if tenant == "acme" else folks.beta_admin
    return TenantAdmin(
        tenant=Tenant.objects.get(external_id=tenant), person=user.username, user_id=user.pk
    )


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the services -------------------------------------------------------------------------


def test_a_tenant_admin_sets_a_users_budget_within_the_ceiling_and_it_is_audited(
    folks: People,
) -> None:
    acting = admin_of(folks)
    budget = budget_set_limit(
        tenant="acme", end_user="bob-acme", amount="20", window="day", acting=acting
    )
    assert budget.limit == Decimal(20)
    event = AuditEvent.objects.filter(action="budget.create").latest("pk")
    assert event.actor == "ann (tenant admin of acme)"
    assert event.tenant is not None
    assert event.tenant.external_id == "acme"
    # status() reads the same row at once.
    mine = [s for s in budgets.status(tenant="acme", end_user="bob-acme") if s.window == "day"]
    assert any(s.scope == Scope.END_USER and s.limit == Decimal(20) for s in mine)


@pytest.mark.parametrize(
    ("ceiling", "tenant_day", "amount", "allowed"),
    [
        (Decimal(100), None, "100", True),
        (Decimal(100), None, "100.01", False),  # above the operators' ceiling
        (Decimal(100), Decimal(30), "30", True),
        (Decimal(100), Decimal(30), "30.01", False),  # above the tenant's own daily budget
        (None, None, "1", False),  # no ceiling: nothing may be set
    ],
)
def test_never_above_the_ceiling_nor_the_tenants_own_budget(
    folks: People, ceiling: Decimal | None, tenant_day: Decimal | None, amount: str, allowed: bool
) -> None:
    Tenant.objects.filter(external_id="acme").update(self_serve_ceiling=ceiling)
    if tenant_day is not None:
        budgets.set_limit(tenant="acme", amount=tenant_day, window="day")
    acting = admin_of(folks)
    before = Budget.objects.count(), AuditEvent.objects.count()
    if allowed:
        budget_set_limit(tenant="acme", end_user="u9", amount=amount, window="day", acting=acting)
        return
    with pytest.raises(SelfServeDenied) as refused:
        budget_set_limit(tenant="acme", end_user="u9", amount=amount, window="day", acting=acting)
    assert refused.value.field == "amount"
    assert (Budget.objects.count(), AuditEvent.objects.count()) == before  # nothing written


def test_the_plans_ceiling_and_switch_apply_unless_the_tenant_overrides(folks: People) -> None:
    plan = Plan.objects.create(name="team", self_serve=True, self_serve_ceiling=Decimal(10))
    Tenant.objects.filter(external_id="acme").update(
        plan=plan, self_serve=None, self_serve_ceiling=None
    )
    acting = admin_of(folks)
    budget_set_limit(tenant="acme", end_user="u1", amount="10", window="day", acting=acting)
    with pytest.raises(SelfServeDenied):
        budget_set_limit(tenant="acme", end_user="u1", amount="11", window="day", acting=acting)
    Tenant.objects.filter(external_id="acme").update(self_serve=False)
    with pytest.raises(SelfServeDenied, match="Self-serve is off"):
        budget_set_limit(tenant="acme", end_user="u1", amount="5", window="day", acting=acting)


def test_self_serve_is_off_by_default(folks: People) -> None:
    Tenant.objects.filter(external_id="acme").update(self_serve=None, self_serve_ceiling=None)
    with pytest.raises(SelfServeDenied, match="Self-serve is off"):
        budget_set_limit(
            tenant="acme", end_user="u1", amount="1", window="day", acting=admin_of(folks)
        )


def test_a_tenant_admin_never_sets_the_tenants_own_cap_nor_a_budgets_shape(folks: People) -> None:
    acting = admin_of(folks)
    with pytest.raises(SelfServeDenied, match="set by the operators"):
        budget_set_limit(tenant="acme", amount="1", window="day", acting=acting)
    with pytest.raises(SelfServeDenied):
        budget_set_limit(
            tenant="acme", end_user="u1", amount="1", window="day", hot=True, acting=acting
        )


def test_the_service_refuses_another_tenant_and_a_member_whatever_the_caller(
    folks: People,
) -> None:
    acme = admin_of(folks)
    with pytest.raises(SelfServeDenied, match="another organisation"):
        budget_set_limit(tenant="beta", end_user="zed-beta", amount="1", window="day", acting=acme)
    member = TenantAdmin(tenant=acme.tenant, person="alice", user_id=folks.acme_member.pk)
    with pytest.raises(SelfServeDenied, match="Members"):
        budget_set_limit(tenant="acme", end_user="u1", amount="1", window="day", acting=member)
    beta_budget = Budget.objects.get(scope=Scope.TAG, tenant__external_id="beta")
    with pytest.raises(SelfServeDenied):
        budget_remove(beta_budget, acting=acme)
    beta_user = EndUser.objects.get(external_id="zed-beta")
    with pytest.raises(SelfServeDenied):
        end_user_spend_reset(end_user=beta_user, reason="x", acting=acme)
    with pytest.raises(SelfServeDenied):
        api_key_create(tenant="beta", name="mine", acting=acme)


def test_an_operator_key_is_not_a_tenant_admins_to_budget_or_revoke(folks: People) -> None:
    acting = admin_of(folks)
    operator, _ = api_key_create(tenant=None, name="ops")
    with pytest.raises(SelfServeDenied):
        budget_set_limit(
            tenant="acme", api_key=operator.prefix, amount="1", window="day", acting=acting
        )
    with pytest.raises(SelfServeDenied):
        api_key_revoke(operator, acting=acting)


def test_a_raise_stays_within_the_ceiling_and_can_be_revoked(folks: People) -> None:
    acting = admin_of(folks)
    budget = budget_set_limit(
        tenant="acme", end_user="bob-acme", amount="60", window="day", acting=acting
    )
    until = timezone.now() + timedelta(hours=1)
    raise_ = budget_raise_grant(
        budget=budget, amount="40", until=until, reason="demo", acting=acting
    )
    with pytest.raises(SelfServeDenied):  # 60 + 40 + 0.01 > 100
        budget_raise_grant(budget=budget, amount="0.01", until=until, reason="x", acting=acting)
    with pytest.raises(SelfServeDenied):  # the limit with its raise above the ceiling
        budget_set_limit(
            tenant="acme", end_user="bob-acme", amount="61", window="day", acting=acting
        )
    budget_raise_revoke(raise_, acting=acting)
    assert BudgetRaise.objects.get(pk=raise_.pk).ends_at <= timezone.now()
    assert AuditEvent.objects.filter(action="budget.raise_revoke", actor=acting.actor).exists()


def test_a_hidden_action_is_refused_by_the_service(folks: People, settings: Any) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "SELF_SERVE_HIDDEN_ACTIONS": ["api_keys"]}
    with pytest.raises(SelfServeDenied, match="api_keys"):
        api_key_create(tenant="acme", name="k", acting=admin_of(folks))


def test_keys_a_tenant_admin_creates_are_their_tenants_and_never_self_serve(
    folks: People,
) -> None:
    key, secret = api_key_create(tenant="acme", name="ci", acting=admin_of(folks))
    assert key.tenant is not None
    assert key.tenant.external_id == "acme"
    assert not key.self_serve
    assert secret.startswith(key.prefix)


def test_a_tenant_admin_mints_at_most_the_maximum_of_live_keys(
    folks: People, settings: Any
) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "SELF_SERVE_MAX_API_KEYS": 3}
    acting = admin_of(folks)
    live = ApiKey.objects.filter(tenant__external_id="acme", revoked=False).count()
    made = [api_key_create(tenant="acme", name=f"k{n}", acting=acting)[0] for n in range(3 - live)]
    before = (ApiKey.objects.count(), AuditEvent.objects.count())
    with pytest.raises(SelfServeDenied, match=r"has 3 live API keys.*SELF_SERVE_MAX_API_KEYS"):
        api_key_create(tenant="acme", name="one-more", acting=acting)
    assert (ApiKey.objects.count(), AuditEvent.objects.count()) == before  # nothing written
    # Other tenants count their own; the operators may create more; revoked and expired keys
    # no longer count.
    api_key_create(tenant="beta", name="b", acting=admin_of(folks, "beta"))
    api_key_create(tenant="acme", name="by-ops", actor="ops")
    api_key_revoke(made[0], acting=acting)
    api_key_revoke(ApiKey.objects.get(name="by-ops"), actor="ops")
    key, _ = api_key_create(tenant="acme", name="again", acting=acting)
    ApiKey.objects.filter(pk=key.pk).update(expiry_date=timezone.now() - timedelta(seconds=1))
    api_key_create(tenant="acme", name="after-expiry", acting=acting)


@pytest.mark.django_db(transaction=True)
def test_two_admins_minting_the_last_key_at_once_get_one(
    folks: People, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_budgets.control import api_keys as keys
    from tests.concurrency import run_threads

    live = ApiKey.objects.filter(tenant__external_id="acme", revoked=False).count()
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "SELF_SERVE_MAX_API_KEYS": live + 1}
    acting = admin_of(folks)
    counted = keys.api_key_live_count
    second = threading.Event()
    arrivals: list[int] = []

    def counting(tenant: Any) -> int:
        found = counted(tenant)
        arrivals.append(found)
        if len(arrivals) == 1:
            # The first to count waits until the second has counted too: without the tenant's
            # lock both see room and both create. With it the second cannot count before the
            # first commits, and the wait ends unanswered (nothing is asserted on its time).
            second.wait(timeout=2)
        else:
            second.set()
        return found

    monkeypatch.setattr(keys, "api_key_live_count", counting)
    results = run_threads(
        2, lambda n: api_key_create(tenant="acme", name=f"race-{n}", acting=acting)
    )
    assert sorted(type(r).__name__ for r in results) == ["SelfServeDenied", "tuple"]
    assert ApiKey.objects.filter(tenant__external_id="acme", revoked=False).count() == live + 1


def test_alerts_subscriptions_are_the_tenants_own_and_tenant_events_only(
    folks: People,
) -> None:
    acting = admin_of(folks)
    endpoint, secret = self_serve_subscribe(
        acting, kind="email", target="ops@acme.test", event_types=["threshold.crossed"], **SITE
    )
    assert endpoint.tenant == acting.tenant
    assert secret == ""
    with pytest.raises(InvalidUsage, match=r"stripe\.delivery_parked is for the operators'") as e:
        self_serve_subscribe(
            acting,
            kind="email",
            target="ops@acme.test",
            event_types=["stripe.delivery_parked"],
            **SITE,
        )
    assert e.value.field == "event_types"


def test_a_budget_that_held_calls_is_not_removed_but_says_what_to_do(folks: People) -> None:
    acting = admin_of(folks)
    budget = budget_set_limit(
        tenant="acme", end_user="carol", amount="50", window="day", acting=acting
    )
    reserve_30(tenant="acme", end_user="carol").release()
    with pytest.raises(InvalidUsage, match="Set its limit instead"):
        budget_remove(budget, acting=acting)
    fresh = budget_set_limit(
        tenant="acme", end_user="dave", amount="5", window="day", acting=acting
    )
    budget_remove(fresh, acting=acting)
    assert not Budget.objects.filter(pk=fresh.pk).exists()
    assert AuditEvent.objects.filter(action="budget.remove", actor=acting.actor).exists()


# --- the pages ----------------------------------------------------------------------------


def action_urls(folks: People) -> list[tuple[str, str, dict[str, Any]]]:
    """Every action URL with a valid body for acme (method, path, data)."""
    acting = admin_of(folks)
    rows = tenant_rows(acting, "bob-acme")
    raise_, key, endpoint = rows["raise"], rows["key"], rows["endpoint"]
    unused = budget_set_limit(
        tenant="acme", end_user="dave", amount="5", window="day", acting=acting
    )
    day = {"kind": "end_user", "who": "bob-acme", "window": "day", "amount": "7", "confirm": "yes"}
    return [
        ("get", "/usage/manage/", {}),
        ("post", "/usage/manage/budgets/set/", day),
        (
            "post",
            "/usage/manage/raises/grant/",
            {"user": "bob-acme", "window": "day", "amount": "1", "hours": "1", "reason": "r"},
        ),
        ("post", f"/usage/manage/raises/{raise_.pk}/revoke/", {"confirm": "yes"}),
        (
            "post",
            "/usage/manage/users/reset/",
            {"user": "bob-acme", "reason": "r", "confirm": "yes"},
        ),
        ("post", "/usage/manage/keys/create/", {"name": "new"}),
        ("post", f"/usage/manage/keys/{key.pk}/revoke/", {"confirm": "yes"}),
        (
            "post",
            "/usage/manage/alerts/subscribe/",
            {"kind": "email", "target": "x@acme.test", "event_types": ["threshold.crossed"]},
        ),
        ("post", f"/usage/manage/alerts/{endpoint.pk}/remove/", {"confirm": "yes"}),
        ("post", f"/usage/manage/budgets/{unused.pk}/remove/", {"confirm": "yes"}),
    ]


def test_a_member_sees_no_forms_and_gets_403_on_every_action_url(folks: People) -> None:
    urls = action_urls(folks)
    member = client_for(folks.acme_member)
    overview = member.get("/usage/").content.decode()
    assert "/usage/manage/" not in overview
    assert 'method="post"' not in overview  # the export's GET form is the page's only form
    before = AuditEvent.objects.count()
    for method, path, data in urls:
        response = getattr(member, method)(path, data)
        assert response.status_code == 403, (path, response.status_code)
        if method == "post":
            assert member.get(path).status_code == 403
    assert AuditEvent.objects.count() == before


def test_the_tab_and_the_forms_are_a_tenant_admins_only_where_self_serve_is_on(
    folks: People,
) -> None:
    admin = client_for(folks.acme_admin)
    assert 'href="/usage/manage/"' in admin.get("/usage/").content.decode()
    Tenant.objects.filter(external_id="acme").update(self_serve=False)
    assert 'href="/usage/manage/"' not in admin.get("/usage/").content.decode()
    assert admin.get("/usage/manage/").status_code == 403
    support = client_for(folks.support)
    assert support.get("/usage/manage/?tenant=beta").status_code == 403


BETA_IDS = ["budget", "raise", "key", "endpoint"]


def tenant_rows(acting: TenantAdmin, user: str) -> dict[str, Any]:
    """One of each row a tenant admin acts on, made through the services as ``acting``."""
    tenant = acting.tenant.external_id
    budget = budget_set_limit(
        tenant=tenant, end_user=user, amount="50", window="day", acting=acting
    )
    until = timezone.now() + timedelta(hours=1)
    raise_ = budget_raise_grant(budget=budget, amount="1", until=until, reason="r", acting=acting)
    key, _ = api_key_create(tenant=tenant, name=f"{tenant}-key", acting=acting)
    endpoint, _ = self_serve_subscribe(
        acting,
        kind="email",
        target=f"ops@{tenant}.test",
        event_types=["threshold.crossed"],
        **SITE,
    )
    return {"budget": budget, "raise": raise_, "key": key, "endpoint": endpoint}


def beta_rows() -> dict[str, Any]:
    return tenant_rows(admin_of_beta(), "zed-beta")


def admin_of_beta() -> TenantAdmin:
    return TenantAdmin(tenant=Tenant.objects.get(external_id="beta"), person="bea", user_id=None)


def snapshot() -> tuple[Any, ...]:
    """Everything of beta's an acme admin might try to change."""
    return (
        list(Budget.objects.filter(tenant__external_id="beta").values_list("pk", "limit")),
        list(BudgetRaise.objects.filter(budget__tenant__external_id="beta").values_list("ends_at")),
        list(ApiKey.objects.filter(tenant__external_id="beta").values_list("pk", "revoked")),
        list(AlertEndpoint.objects.filter(tenant__external_id="beta").values_list("pk")),
        AuditEvent.objects.filter(tenant__external_id="beta").count(),
    )


@pytest.mark.parametrize(
    ("path", "rows"),
    [
        ("/usage/manage/budgets/{budget}/remove/", "budget"),
        ("/usage/manage/raises/{raise}/revoke/", "raise"),
        ("/usage/manage/keys/{key}/revoke/", "key"),
        ("/usage/manage/alerts/{endpoint}/remove/", "endpoint"),
    ],
)
def test_an_acme_admin_cannot_touch_beta_by_an_id_in_the_url(
    folks: People, path: str, rows: str
) -> None:
    found = beta_rows()
    url = path.format(**{name: found[name].pk for name in BETA_IDS})
    admin = client_for(folks.acme_admin)
    before = snapshot()
    assert admin.get(url).status_code == 404
    assert admin.post(url, {"confirm": "yes"}).status_code == 404
    assert admin.post(url + "?tenant=beta", {"confirm": "yes", "tenant": "beta"}).status_code == 404
    assert snapshot() == before


@pytest.mark.parametrize(
    ("path", "data"),
    [
        (
            "/usage/manage/budgets/set/",
            {"kind": "end_user", "who": "zed-beta", "window": "day", "amount": "1"},
        ),
        (
            "/usage/manage/budgets/set/",
            {"kind": "api_key", "who": "{key}", "window": "day", "amount": "1"},
        ),
        (
            "/usage/manage/budgets/set/",
            {"kind": "tag", "who": "project=beta-secret", "window": "day", "amount": "1"},
        ),
        (
            "/usage/manage/raises/grant/",
            {"user": "zed-beta", "window": "day", "amount": "1", "hours": "1", "reason": "r"},
        ),
        ("/usage/manage/users/reset/", {"user": "zed-beta", "reason": "r"}),
        ("/usage/manage/keys/create/", {"name": "beta-key"}),
        (
            "/usage/manage/alerts/subscribe/",
            {
                "kind": "email",
                "target": "ops@beta.test",
                "event_types": ["threshold.crossed"],
            },
        ),
    ],
)
def test_an_acme_admin_cannot_touch_beta_by_an_id_in_a_form_field(
    folks: People, path: str, data: dict[str, Any]
) -> None:
    found = beta_rows()
    body = {
        k: (v.format(key=found["key"].prefix) if isinstance(v, str) else v) for k, v in data.items()
    }
    # Whatever else the form carries: the tenant in the body and in the query string.
    body |= {"confirm": "yes", "tenant": "beta", "budget": found["budget"].pk}
    admin = client_for(folks.acme_admin)
    before = snapshot()
    response = admin.post(path + "?tenant=beta", body)
    assert response.status_code in (200, 302, 400, 403, 404)
    assert snapshot() == before
    # What acme's admin changed (if anything) is acme's: a new user, key or endpoint of acme.
    assert (
        not EndUser.objects.filter(tenant__external_id="beta")
        .exclude(external_id="zed-beta")
        .exists()
    )


def test_every_page_action_is_audited_with_the_person_and_the_tenant(folks: People) -> None:
    urls = action_urls(folks)
    admin = client_for(folks.acme_admin)
    assert admin.get(urls[0][1]).status_code == 200
    done = []
    for _method, path, data in urls[1:]:
        last = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
        response = admin.post(path, data)
        assert response.status_code in (200, 302), (path, response.status_code)
        new = list(AuditEvent.objects.filter(pk__gt=last))
        assert len(new) == 1, (path, [e.action for e in new])
        assert new[0].actor == "ann (tenant admin of acme)"
        assert new[0].tenant is not None
        assert new[0].tenant.external_id == "acme"
        done.append(new[0].action)
    assert done == [
        "budget.change_limit",
        "budget.raise",
        "budget.raise_revoke",
        "end_user.reset_spend",
        "api_key.create",
        "api_key.revoke",
        "alert_endpoint.create",
        "alert_endpoint.delete",
        "budget.remove",
    ]


def test_a_bad_amount_is_refused_beside_its_field_and_nothing_is_written(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    before = Budget.objects.count(), AuditEvent.objects.count()
    for amount, words in [("-1", "amount"), ("1e3", "amount"), ("101", "ceiling")]:
        response = admin.post(
            "/usage/manage/budgets/set/",
            {
                "kind": "end_user",
                "who": "bob-acme",
                "window": "day",
                "amount": amount,
                "confirm": "yes",
            },
        )
        assert response.status_code == 400, amount
        text = response.content.decode()
        assert 'aria-invalid="true"' in text, amount
        assert words in text, amount
    assert (Budget.objects.count(), AuditEvent.objects.count()) == before


def test_the_preview_says_what_the_user_has_spent_of_the_new_limit(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    response = admin.post(
        "/usage/manage/budgets/set/",
        {"kind": "end_user", "who": "bob-acme", "window": "day", "amount": "5"},
    )
    assert response.status_code == 200
    text = re.sub(r"<[^>]+>", "", response.content.decode())
    assert "bob-acme has spent 6.00 USD of the new 5.00 USD today." in text
    assert not Budget.objects.filter(end_user__external_id="bob-acme", window="day").exists()


def test_a_capped_user_is_refused_naming_the_cap_then_passes_after_a_raise(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    admin.post(
        "/usage/manage/budgets/set/",
        {"kind": "end_user", "who": "carol", "window": "day", "amount": "20", "confirm": "yes"},
    )
    with pytest.raises(BudgetExceeded, match="carol"):
        reserve_30(tenant="acme", end_user="carol")
    admin.post(
        "/usage/manage/raises/grant/",
        {"user": "carol", "window": "day", "amount": "15", "hours": "1", "reason": "deadline"},
    )
    reserve_30(tenant="acme", end_user="carol").release()


def test_operators_set_a_tenants_switch_and_ceiling_audited(folks: People) -> None:
    from llm_budgets.control.self_serve import tenant_self_serve_set

    acme = Tenant.objects.get(external_id="acme")
    tenant_self_serve_set(acme, enabled=True, ceiling="7", actor="maria", reason="pilot")
    acting = admin_of(folks)
    with pytest.raises(SelfServeDenied, match=r"7\.00 USD"):
        budget_set_limit(tenant="acme", end_user="u1", amount="8", window="day", acting=acting)
    event = AuditEvent.objects.get(action="tenant.self_serve")
    assert (event.actor, event.after) == ("maria", {"self_serve": True, "ceiling": "7"})


def test_only_operators_grant_the_self_serve_scope_and_only_to_tenant_keys(folks: People) -> None:
    key, _ = api_key_create(tenant="acme", name="admin-tool", self_serve=True)
    assert key.self_serve
    with pytest.raises(InvalidUsage, match="self_serve"):
        api_key_create(tenant=None, name="ops", self_serve=True)
    with pytest.raises(InvalidUsage, match="self_serve"):
        api_key_create(tenant="acme", name="mine", self_serve=True, acting=admin_of(folks))


def test_operators_turn_self_serve_on_for_a_plan_in_the_admin(folks: People) -> None:
    from django.contrib.auth.models import User

    boss = User.objects.create_superuser("root", password="pw")
    admin = client_for(boss)
    form = admin.get("/admin/llm_budgets/plan/add/").content.decode()
    assert 'name="self_serve"' in form
    assert 'name="self_serve_ceiling"' in form


def test_a_hidden_action_has_no_form_and_its_urls_answer_403(folks: People, settings: Any) -> None:
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "SELF_SERVE_HIDDEN_ACTIONS": ["reset_spend"]}
    admin = client_for(folks.acme_admin)
    page = admin.get("/usage/manage/").content.decode()
    assert "/usage/manage/users/reset/" not in page
    assert "/usage/manage/budgets/set/" in page
    response = admin.post("/usage/manage/users/reset/", {"user": "bob-acme", "reason": "r"})
    assert response.status_code == 403


def test_a_destructive_action_asks_first_and_changes_nothing_until_confirmed(
    folks: People,
) -> None:
    acting = admin_of(folks)
    key, _ = api_key_create(tenant="acme", name="ci", acting=acting)
    admin = client_for(folks.acme_admin)
    before = AuditEvent.objects.count()
    confirm = admin.get(f"/usage/manage/keys/{key.pk}/revoke/")
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert "Revoke this API key?" in text
    assert "csrfmiddlewaretoken" in text
    reset = admin.post("/usage/manage/users/reset/", {"user": "bob-acme", "reason": "r"})
    assert "Reset this user&#x27;s spend?" in reset.content.decode()
    key.refresh_from_db()
    assert not key.revoked
    assert AuditEvent.objects.count() == before


def test_forms_need_the_csrf_token(folks: People) -> None:
    admin = Client(enforce_csrf_checks=True)
    admin.force_login(folks.acme_admin)
    body = {"kind": "end_user", "who": "bob-acme", "window": "day", "amount": "5", "confirm": "yes"}
    assert admin.post("/usage/manage/budgets/set/", body).status_code == 403
    assert not Budget.objects.filter(end_user__external_id="bob-acme", window="day").exists()


def test_support_staff_see_the_changes_in_the_admins_audit_log(folks: People) -> None:
    from django.contrib.auth.models import User

    budget_set_limit(
        tenant="acme", end_user="bob-acme", amount="9", window="day", acting=admin_of(folks)
    )
    boss = User.objects.create_superuser("root", password="pw")
    log = client_for(boss).get("/admin/llm_budgets/auditevent/").content.decode()
    assert "ann (tenant admin of acme)" in log


def test_an_email_address_a_tenant_admin_subscribes_on_the_page_confirms_first(
    folks: People,
) -> None:
    from django.core import mail

    from llm_budgets.alerts.endpoints import AWAITING_CONFIRMATION

    page = client_for(folks.acme_admin).post(
        "/usage/manage/alerts/subscribe/",
        {"kind": "email", "target": "someone@else.test", "event_types": ["threshold.crossed"]},
    )
    assert page.status_code == 302
    endpoint = AlertEndpoint.objects.get(target="someone@else.test")
    assert (endpoint.enabled, endpoint.disabled_reason) == (False, AWAITING_CONFIRMATION)
    (message,) = mail.outbox
    assert message.to == ["someone@else.test"]
    link = re.search(r"http://testserver/api/llm-budgets/v1/alerts/confirm/\S+", message.body)
    assert link is not None
    shown = client_for(folks.acme_admin).get("/usage/manage/").content.decode()
    assert "awaiting confirmation by someone@else.test" in shown
    assert Client().post(link.group(0)).status_code == 200
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.unconfirmed_emails) == (True, {})
