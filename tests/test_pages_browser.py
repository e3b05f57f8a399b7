"""The tenant pages in a real chromium: a tenant admin logs in, checks the overview's figures,
follows to the charts and the export, and cannot reach another tenant. Screenshots go to
test-artifacts/screenshots/ (the ones in docs/images/ come from here)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import UsageRecord
from llm_budgets.money import money as money_text
from tests.browser import screenshot, uses_browser
from tests.factories import reserve_30
from tests.pages import people, usage_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1200, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def page(chromium_browser: Any, live_server: Any) -> Any:
    context = chromium_browser.new_context(viewport=DESKTOP, accept_downloads=True)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/usage/")
    assert "/accounts/login/" in page.url  # anonymous: sent to log in first
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/usage/")


def test_a_tenant_admin_reads_the_pages_in_a_browser(page: Any, live_server: Any) -> None:
    usage_data()
    people()
    budgets.set_limit(tenant="acme", end_user="bob-acme", amount=20, window="day")
    with pytest.raises(BudgetExceeded):
        reserve_30(tenant="acme", end_user="bob-acme")
    base = live_server.url
    log_in(page, base, "ann")

    # The overview's figures are budgets.status()'s.
    tenant = next(s for s in budgets.status(tenant="acme") if s.scope == "tenant")
    card = page.locator("article.lb-budget", has_text="Your organisation")
    for figure in ("limit", "spent", "reserved", "remaining"):
        shown = card.locator(f'[data-figure="{figure}"]').inner_text()
        assert shown == money_text(getattr(tenant, figure), tenant.currency)
    assert page.get_by_role("progressbar").count() >= 1
    assert page.get_by_role("heading", name="LLM usage").is_visible()
    screenshot(page, "pages-overview")

    # Keyboard: the first Tab reaches the skip link, the next one the navigation.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Overview"

    page.get_by_role("link", name="By day and model").click()
    page.wait_for_url(f"{base}/usage/models/")
    assert page.get_by_role("img", name="Spend by day").is_visible()
    assert page.get_by_role("img", name="Spend by model").is_visible()
    assert page.get_by_role("rowheader", name="m30 (fake)").is_visible()
    screenshot(page, "pages-models")

    page.get_by_role("link", name="By user").click()
    page.wait_for_url(f"{base}/usage/users/")
    rows = page.locator("table.lb-table tbody tr")
    assert rows.first.locator("th").inner_text() == "alice-acme"
    assert page.get_by_text("<script>acme</script>").count() >= 1  # shown as text, not run
    page.get_by_role("link", name="Name").click()
    page.wait_for_url(f"{base}/usage/users/?sort=name")
    screenshot(page, "pages-users")

    page.get_by_role("link", name="Refused calls").click()
    page.wait_for_url(f"{base}/usage/refusals/")
    assert page.get_by_text("for user bob-acme needed up to 30.00 USD").is_visible()
    screenshot(page, "pages-refusals")

    page.get_by_role("link", name="Overview").click()
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Download CSV").click()
    download = download_info.value
    with open(download.path(), encoding="utf-8") as handle:
        rows_csv = list(csv.reader(io.StringIO(handle.read())))
    assert rows_csv[0][0] == "time"
    assert len(rows_csv) - 1 == UsageRecord.objects.filter(tenant__external_id="acme").count()
    assert download.suggested_filename.startswith("usage-acme-")

    # Another tenant's pages are out of reach, whatever the parameters.
    page.goto(f"{base}/usage/users/?tenant=beta")
    text = page.locator("body").inner_text()
    assert "zed-beta" not in text
    assert "alice-acme" in text
    response = page.request.get(f"{base}/usage/export.csv?tenant=beta")
    assert "zed-beta" not in response.text()


def test_the_overview_fits_a_phone(chromium_browser: Any, live_server: Any) -> None:
    usage_data()
    people()
    context = chromium_browser.new_context(viewport=PHONE, device_scale_factor=2)
    page = context.new_page()
    try:
        log_in(page, live_server.url, "ann")
        # Nothing wider than the screen: no sideways scrolling of the page itself.
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"]
        screenshot(page, "pages-overview-phone")
        page.goto(f"{live_server.url}/usage/models/")
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        screenshot(page, "pages-models-phone")
    finally:
        context.close()


def test_browser_tests_run_after_every_other_test(request: pytest.FixtureRequest) -> None:
    # The chromium session leaves asyncio's loop running in this thread (tests/browser.py).
    items = request.session.items
    first = next(i for i, item in enumerate(items) if uses_browser(item))
    assert all(uses_browser(item) for item in items[first:])
    assert any(not uses_browser(item) for item in items[:first]) or first == 0
