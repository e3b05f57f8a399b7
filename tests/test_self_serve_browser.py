"""Self-serve in a real chromium (issue #29): a tenant admin caps one of their users from the
Budgets tab, the user's next call is refused naming that cap, the admin raises it and the call
passes; a member sees no Budgets tab and gets 403. Screenshots: test-artifacts/screenshots/
(copied into docs/images/ for docs/pages.md)."""

from __future__ import annotations

import os
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import AuditEvent, Budget, Tenant
from tests.browser import screenshot
from tests.factories import reserve_30
from tests.pages import people, usage_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


@pytest.fixture
def page(chromium_browser: Any, live_server: Any) -> Any:
    context = chromium_browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/?next=/usage/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/usage/")


def keep(page: Any, name: str) -> None:
    """A screenshot; with LLMB_DOCS_SCREENSHOTS=1 also docs/pages.md's copy (so a test run does
    not rewrite the docs' images by itself)."""
    path = screenshot(page, name)
    if os.environ.get("LLMB_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(path, DOCS_IMAGES / f"{name}.png")


def test_a_tenant_admin_caps_a_user_who_is_refused_then_raises_it(
    page: Any, live_server: Any
) -> None:
    usage_data()
    people()
    Tenant.objects.filter(external_id="acme").update(
        self_serve=True, self_serve_ceiling=Decimal(100)
    )
    base = live_server.url
    log_in(page, base, "ann")
    page.get_by_role("link", name="Budgets").click()
    page.wait_for_url(f"{base}/usage/manage/")
    assert page.get_by_text("up to 100.00 USD each").is_visible()
    keep(page, "pages-manage")

    # Keyboard only: fill the budget form and send it with Enter.
    page.get_by_label("For", exact=True).first.select_option("end_user")
    page.get_by_label("Which one").fill("carol")
    page.get_by_label("Window", exact=True).select_option("day")
    page.get_by_label("Limit").fill("20")
    page.get_by_label("Limit").press("Enter")
    page.wait_for_url(f"{base}/usage/manage/budgets/set/")
    assert page.get_by_text("carol has spent 0.00 USD of the new 20.00 USD today.").is_visible()
    keep(page, "pages-manage-preview")
    page.get_by_role("button", name="Set the budget").click()
    page.wait_for_url(f"{base}/usage/manage/?**")
    assert page.get_by_role("status").inner_text() == "The budget is set."
    row = page.get_by_role("row", name="User carol")
    assert row.get_by_role("cell").nth(1).inner_text() == "20.00 USD"

    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(tenant="acme", end_user="carol")
    assert "end user acme/carol" in str(refused.value)
    assert "20.00" in str(refused.value)

    raises = page.locator("#lb-raises")
    raises.get_by_label("User id").fill("carol")
    raises.get_by_label("Budget window").select_option("day")
    raises.get_by_label("Extra amount").fill("15")
    raises.get_by_label("Why").fill("quarter-end report")
    raises.get_by_role("button", name="Grant the raise").click()
    page.wait_for_url(f"{base}/usage/manage/?**")
    assert page.get_by_role("status").inner_text() == "The raise is granted."
    reserve_30(tenant="acme", end_user="carol").release()  # 30 <= 20 + 15

    # A key: the secret is shown once.
    keys = page.locator("#lb-keys")
    keys.get_by_label("Name").fill("reporting")
    keys.get_by_role("button", name="Create the key").click()
    secret = page.get_by_label("The key").input_value()
    assert "." in secret
    keep(page, "pages-manage-key")

    actions = list(
        AuditEvent.objects.filter(actor="ann (tenant admin of acme)").values_list(
            "action", flat=True
        )
    )
    assert sorted(actions) == ["api_key.create", "budget.create", "budget.raise"]


def test_a_member_sees_no_budgets_tab_and_gets_403(page: Any, live_server: Any) -> None:
    usage_data()
    people()
    Tenant.objects.filter(external_id="acme").update(
        self_serve=True, self_serve_ceiling=Decimal(100)
    )
    base = live_server.url
    log_in(page, base, "alice")
    assert page.get_by_role("link", name="Budgets").count() == 0
    assert page.locator('form[method="post"]').count() == 0
    response = page.goto(f"{base}/usage/manage/")
    assert response.status == 403


def test_every_self_serve_state_meets_wcag_21_aa(chromium_browser: Any, live_server: Any) -> None:
    """The Budgets tab, a refusal beside its field, the preview, a confirmation and a key shown
    once: axe-core clean, the Tab walk (1280 px), nothing scrolling sideways (narrow widths)."""
    from tests.a11y import VIEWPORTS, Audit, require_axe

    require_axe()
    usage_data()
    people()
    Tenant.objects.filter(external_id="acme").update(
        self_serve=True, self_serve_ceiling=Decimal(100)
    )
    budget = Budget.objects.filter(tenant__external_id="acme", scope="tag").get()
    base = live_server.url
    audit = Audit()
    context = chromium_browser.new_context(viewport=VIEWPORTS["1280"]["viewport"])
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        log_in(page, base, "ann")
        for width, options in VIEWPORTS.items():
            page.set_viewport_size(options["viewport"])
            wide = width == "1280"
            page.goto(f"{base}/usage/manage/")
            audit.check(page, f"manage @{width}", keyboard=wide, fits=not wide)
            form = page.locator("#lb-budgets")
            form.get_by_label("Which one").fill("carol")
            form.get_by_label("Limit").fill("500")
            form.get_by_role("button", name="Preview").click()
            page.wait_for_load_state()
            audit.check(page, f"preview @{width}", keyboard=wide, fits=not wide)
            page.get_by_role("button", name="Set the budget").click()
            page.wait_for_load_state()
            assert page.locator('[aria-invalid="true"]').count() == 1  # above the ceiling
            audit.check(page, f"refused @{width}", keyboard=wide, fits=not wide)
            page.goto(f"{base}/usage/manage/budgets/{budget.pk}/remove/")
            audit.check(page, f"confirm @{width}", keyboard=wide, fits=not wide)
            page.goto(f"{base}/usage/manage/")
            keys = page.locator("#lb-keys")
            keys.get_by_label("Name").fill(f"key-{width}")
            keys.get_by_role("button", name="Create the key").click()
            page.wait_for_load_state()
            audit.check(page, f"key shown once @{width}", keyboard=wide, fits=not wide)
    finally:
        context.close()
    assert len(audit.states) == 15
    audit.assert_clean()
