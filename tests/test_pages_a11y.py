"""WCAG 2.1 AA on every state of the tenant usage pages, in a real chromium (tests/a11y.py).

Every tab as a tenant admin, a member and support staff, the tenant picker and the login page, at
1280 px, 375 px and 200% zoom: axe-core finds no violation, Tab reaches every control with its
focus visible (1280 px), and nothing scrolls the page sideways (the narrow widths). Screenshots
of the narrow widths go to test-artifacts/screenshots/a11y/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from demo.usage_month import page_users_ensure
from llm_budgets.control.killswitches import kill_switch_trip, switch_scope
from llm_budgets.models import Tenant
from llm_budgets.pages import figures
from llm_budgets.roles import SUPPORT
from tests.a11y import VIEWPORTS, Audit, require_axe
from tests.browser import SCREENSHOTS, screenshot
from tests.test_support_browser import PASSWORD, support_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every state a person can reach, by who looks (the support view names its tenant).
ADMIN_PAGES = [
    ("overview", "/usage/"),
    ("models", "/usage/models/"),
    ("users", "/usage/users/"),
    ("users-by-name-page-2", "/usage/users/?sort=name&page=2"),
    ("refusals", "/usage/refusals/"),
    ("refusals-page-2", "/usage/refusals/?page=2"),
    ("export-reversed-range", "/usage/export.csv?start=2026-11-30&end=2026-11-01"),
    ("export-bad-date", "/usage/export.csv?start=yesterday"),
    ("manage", "/usage/manage/"),  # self-serve (its other states: test_self_serve_browser.py)
]
MEMBER_PAGES = [
    ("overview", "/usage/"),
    ("models", "/usage/models/"),
    ("users", "/usage/users/"),
    ("refusals", "/usage/refusals/"),
]
SUPPORT_PAGES = [
    ("picker", "/usage/tenants/"),
    ("picker-no-match", "/usage/tenants/?q=nobody-has-this"),
    ("overview", "/usage/?tenant=acme"),
    ("models", "/usage/models/?tenant=acme"),
    ("users", "/usage/users/?tenant=acme"),
    ("refusals", "/usage/refusals/?tenant=acme"),
    ("export-reversed-range", "/usage/export.csv?tenant=acme&start=2026-11-30&end=2026-11-01"),
]


def _data() -> None:
    support_data()  # the demo data's month, with long names, refusals and a voided line
    page_users_ensure(PASSWORD)  # acme-admin, globex-admin, alice (a member of acme)
    support = get_user_model().objects.create_user("sue", password=PASSWORD, is_staff=True)
    support.groups.add(Group.objects.get(name=SUPPORT))
    scope = switch_scope(tenant="acme", model="gpt-4o")
    assert scope is not None
    kill_switch_trip(scope=scope, reason="runaway agent loop", actor="maria")
    # The Budgets tab exists for acme's admins (docs/pages.md, "Tenant admins act").
    Tenant.objects.filter(external_id="acme").update(self_serve=True, self_serve_ceiling=100)


def _log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/?next=/usage/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()


def _walk(page: Any, audit: Audit, base: str, who: str, pages: list[tuple[str, str]]) -> None:
    for width, options in VIEWPORTS.items():
        page.set_viewport_size(options["viewport"])
        for name, url in pages:
            page.goto(f"{base}{url}")
            state = f"{who} {name} @{width}"
            audit.check(page, state, keyboard=width == "1280", fits=width != "1280")
            if name.startswith("models"):  # the daily figures' table, shown
                page.locator("summary").first.click()
                audit.check(page, f"{state} (table open)")
            if width != "1280":
                screenshot(page, f"a11y/pages-{who}-{name}-{width}")


def test_every_tenant_page_state_meets_wcag_21_aa(
    chromium_browser: Any, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_axe()
    monkeypatch.setattr(figures, "PAGE_ROWS", 3)  # every list has a second page
    _data()
    base = live_server.url
    audit = Audit()
    context = chromium_browser.new_context(viewport=VIEWPORTS["1280"]["viewport"])
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        # The login page, and its error.
        for width, options in VIEWPORTS.items():
            page.set_viewport_size(options["viewport"])
            page.goto(f"{base}/accounts/login/?next=/usage/")
            audit.check(page, f"login @{width}", keyboard=width == "1280", fits=width != "1280")
            page.get_by_label("Username").fill("acme-admin")
            page.get_by_label("Password").fill("wrong")
            page.get_by_role("button", name="Log in").click()
            page.wait_for_load_state()
            audit.check(page, f"login error @{width}", fits=width != "1280")
        for who, username, pages in [
            ("admin", "acme-admin", ADMIN_PAGES),
            ("member", "alice", MEMBER_PAGES),
            ("support", "sue", SUPPORT_PAGES),
        ]:
            context.clear_cookies()
            page.set_viewport_size(VIEWPORTS["1280"]["viewport"])
            _log_in(page, base, username)
            _walk(page, audit, base, who, pages)
    finally:
        context.close()
        audit.dump(SCREENSHOTS.parent / "a11y" / "pages.json")
    assert len(audit.states) >= 60
    audit.assert_clean()
