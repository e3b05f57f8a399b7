"""WCAG 2.1 AA on every admin page the app customises, in a real chromium (tests/a11y.py).

The support admin with the demo data (tests/test_support_browser.py's): the tenant and end-user
pages, every changelist and a change form of every model of the app, the action forms (trip,
clear, raise, reset, void, budget) and each one's error state, at 1280 px, 375 px and 200% zoom,
in light and dark mode. axe-core finds nothing but Django admin's own known violations
(``tests.a11y.DJANGO_ADMIN_KNOWN``), Tab reaches every control of the pages and the forms with
its focus visible, and the tenant and end-user pages never scroll sideways. Screenshots of the
narrow widths go to test-artifacts/screenshots/a11y/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.urls import reverse

from llm_budgets.control.killswitches import kill_switch_clear, kill_switch_trip, switch_scope
from llm_budgets.models import Budget, EndUser, KillSwitch, Scope, Tenant, UsageRecord
from tests.a11y import DJANGO_ADMIN_KNOWN, VIEWPORTS, Audit, require_axe
from tests.browser import SCREENSHOTS, screenshot
from tests.test_support_browser import PASSWORD, support_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _data() -> None:
    support_data()
    # A switch tripped by hand (no detector: the list's detector filter must not offer an empty
    # value), one cleared since, and one open on a provider.
    for provider, clear in (("anthropic", True), ("openai", False)):
        scope = switch_scope(tenant="acme", provider=provider)
        assert scope is not None
        switch = kill_switch_trip(scope=scope, reason="provider incident", actor="maria")
        if clear:
            kill_switch_clear(switch_id=switch.pk, reason="incident over", actor="maria")


def _log_in(page: Any, base: str) -> None:
    page.goto(f"{base}{reverse('admin:login')}")
    page.fill("#id_username", "maria")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def _urls() -> dict[str, list[tuple[str, str]]]:
    """The pages to check, by how thoroughly: ``key`` at every width and in dark mode with a Tab
    walk, ``forms`` likewise (each then submitted empty for its error state), ``lists`` and
    ``changes`` at 1280 px."""
    acme = Tenant.objects.get(external_id="acme")
    alice = EndUser.objects.get(tenant=acme, external_id="alice")
    budget = Budget.objects.filter(tenant=acme, scope=Scope.TENANT).first()
    line = UsageRecord.objects.filter(tenant=acme, voids__isnull=True).last()
    open_switch = KillSwitch.objects.filter(cleared_at__isnull=True).first()
    assert budget is not None
    assert line is not None
    assert open_switch is not None

    def url(name: str, *args: Any, query: str = "") -> str:
        return reverse(f"admin:{name}", args=args) + (f"?{query}" if query else "")

    models = sorted(
        (m._meta.model_name, m) for m in admin.site._registry if m._meta.app_label == "llm_budgets"
    )
    changes = []
    for model_name, model in models:
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            changes.append(
                (f"{model_name} change", url(f"llm_budgets_{model_name}_change", first.pk))
            )
    return {
        "key": [
            ("index", url("index")),
            ("tenant page", url("llm_budgets_tenant_change", acme.pk)),
            ("end-user page", url("llm_budgets_enduser_change", alice.pk)),
            ("tenant list", url("llm_budgets_tenant_changelist")),
            ("end-user list", url("llm_budgets_enduser_changelist")),
            ("kill switch list", url("llm_budgets_killswitch_changelist")),
            ("open switch", url("llm_budgets_killswitch_change", open_switch.pk)),
        ],
        "forms": [
            ("trip form", url("llm_budgets_killswitch_add", query=f"tenant={acme.pk}")),
            ("clear form", url("llm_budgets_killswitch_clear", open_switch.pk)),
            ("raise form", url("llm_budgets_budgetraise_add", query=f"tenant={acme.pk}")),
            ("budget form", url("llm_budgets_budget_add", query=f"tenant={acme.pk}&scope=tag")),
            ("reset end user form", url("llm_budgets_tenant_reset_end_user", acme.pk)),
            ("reset budget form", url("llm_budgets_tenant_reset_budget", acme.pk, budget.pk)),
            ("void form", url("llm_budgets_tenant_void_line", acme.pk, line.pk)),
        ],
        "lists": [(f"{m} list", url(f"llm_budgets_{m}_changelist")) for m, _ in models],
        "changes": changes,
    }


# The pages that must never scroll the whole page sideways, whatever the width.
MUST_FIT = ("tenant page", "end-user page")


def test_every_admin_page_of_the_app_meets_wcag_21_aa(
    chromium_browser: Any, live_server: Any
) -> None:
    require_axe()
    _data()
    base = live_server.url
    urls = _urls()
    audit = Audit(known=DJANGO_ADMIN_KNOWN)
    context = chromium_browser.new_context(viewport=VIEWPORTS["1280"]["viewport"])
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.goto(f"{base}{reverse('admin:login')}")
        audit.check(page, "login @1280", keyboard=True)
        page.fill("#id_username", "maria")
        page.fill("#id_password", "wrong")
        page.click("input[type=submit]")
        page.wait_for_load_state()
        audit.check(page, "login error @1280")
        _log_in(page, base)
        # Every width in light mode, and dark mode at 1280 px (colours do not change with width).
        passes = [("light", width) for width in VIEWPORTS] + [("dark", "1280")]
        for scheme, width in passes:
            page.emulate_media(color_scheme=scheme)
            page.set_viewport_size(VIEWPORTS[width]["viewport"])
            for name, path in urls["key"] + urls["forms"]:
                page.goto(f"{base}{path}")
                state = f"{name} @{width} {scheme}"
                audit.check(
                    page,
                    state,
                    keyboard=width == "1280" and scheme == "light",
                    fits=name in MUST_FIT,
                )
                if width != "1280" and name in MUST_FIT:
                    screenshot(page, f"a11y/admin-{name.replace(' ', '-')}-{width}-{scheme}")
                if (name, path) in urls["forms"]:
                    # The error state: the form sent empty (past the browser's own check,
                    # to see the server's errors).
                    page.evaluate(
                        "document.querySelectorAll('form').forEach(f => f.noValidate = true)"
                    )
                    page.locator("#content-main form input[type=submit]").last.click()
                    page.wait_for_load_state()
                    assert page.locator(".errornote, .errorlist").count() > 0, state
                    audit.check(page, f"{name} errors @{width} {scheme}")
        page.emulate_media(color_scheme="light")
        page.set_viewport_size(VIEWPORTS["1280"]["viewport"])
        for name, path in urls["lists"] + urls["changes"]:
            page.goto(f"{base}{path}")
            audit.check(page, f"{name} @1280")
    finally:
        context.close()
        audit.dump(SCREENSHOTS.parent / "a11y" / "admin.json")
    assert len(audit.states) >= 100
    audit.assert_clean()
