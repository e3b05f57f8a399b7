"""The support admin in a real browser (chromium through Playwright), at 1400 and 1920 px wide.

Walks what a new support person does with the demo data: the tenant page, an end user's page, the
refusals list, tripping and clearing a kill switch, granting a temporary raise; checks what the
screens say and that the lists' key columns fit, and keeps screenshots in
``test-artifacts/screenshots/`` (the ones in docs/support.md come from here)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from demo.demonstration import demo_data_load
from llm_budgets import budgets
from llm_budgets.adjustments import usage_void
from llm_budgets.clock import when
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import EndUser, Tenant, UsageKind, UsageRecord
from tests.browser import screenshot  # chromium_browser: the session fixture (conftest)

WIDTHS = (1400, 1920)
PASSWORD = "a-long-test-password"


def _support_data() -> None:
    """The demo data, a burst of identical refusals and one voided line."""
    demo_data_load(admin=False, month=False)  # the admin tour's data, without the usage month
    get_user_model().objects.create_superuser("maria", "maria@example.com", PASSWORD)
    for _ in range(5):  # bob asks for more than the 2.00 USD a day each end user may spend
        with pytest.raises(BudgetExceeded):
            budgets.reserve(
                tenant="acme",
                end_user="bob",
                provider="openai",
                model="gpt-4o",
                input_tokens=900_000,
                max_output_tokens=1_000,
            )
    line = UsageRecord.objects.filter(
        tenant__external_id="acme", end_user__external_id="bob", kind=UsageKind.CHARGE
    ).first()
    assert line is not None
    usage_void(record_id=line.pk, reason="provider outage, refunded", actor="maria")


def _log_in(page: Any, base: str) -> None:
    page.goto(f"{base}{reverse('admin:login')}")
    page.fill("#id_username", "maria")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def _overflow(page: Any) -> int:
    """How many pixels the page is wider than the window (0: nothing to scroll sideways to)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


def _visible_headers(page: Any) -> list[str]:
    """The result list's column headers that lie inside the window."""
    return list(
        page.evaluate(
            """() => [...document.querySelectorAll('#result_list thead th')]
                .filter(th => th.getBoundingClientRect().right <= window.innerWidth)
                .map(th => (th.querySelector('.text') || th).textContent.trim())"""
        )
    )


@pytest.mark.django_db(transaction=True)
def test_support_admin_in_a_real_browser(chromium_browser: Any, live_server: Any) -> None:
    _support_data()
    base = live_server.url
    acme = Tenant.objects.get(external_id="acme")
    alice = EndUser.objects.get(tenant=acme, external_id="alice")
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    _log_in(page, base)
    tenant_url = f"{base}{reverse('admin:llm_budgets_tenant_change', args=[acme.pk])}"

    # The tenant page: one money format, the tenant's clock, refusals folded with a count.
    page.goto(tenant_url)
    text = page.inner_text("#content")
    assert "Budgets: current period (times in Europe/Amsterdam)" in text
    assert "50.00 USD" in text  # acme's month limit, two places and the code
    assert "\u00d75" in page.inner_text("#llmb-refusals")  # "x5"  # the burst, grouped
    ledger = page.inner_text("#llmb-ledger")
    assert "voided by line" in ledger
    assert "“provider outage, refunded” by maria" in ledger
    assert "0.0000750000" not in text
    assert "UTC" not in page.inner_text("#llmb-budgets")

    # Trip a switch on one end user from the tenant page: the form comes pre-filled.
    page.click("text=Trip a kill switch on this tenant")
    assert page.input_value("#id_tenant") == str(acme.pk)
    assert page.locator("input[value='Trip the switch']").count() == 1
    assert page.locator("input[name=_addanother]").count() == 0
    page.fill("#id_end_user_id", "alice")
    page.fill("#id_reason", "runaway agent loop, stopped while we look")
    screenshot(page, "switch-trip-form")
    page.click("input[value='Trip the switch']")
    assert "Kill switch on end user acme/alice tripped." in page.inner_text(".messagelist")
    assert page.url.endswith(reverse("admin:llm_budgets_enduser_change", args=[alice.pk]))
    screenshot(page, "switch-tripped")

    # Clear it: a button and a confirmation with a reason, not a change form.
    page.click("#llmb-kill-switches a")
    page.click("#llmb-clear-switch")
    page.fill("#id_clear_reason", "loop fixed in agent v2.1")
    screenshot(page, "switch-clear-confirm")
    page.click("input[value='Clear this switch']")
    assert "Kill switch on end user acme/alice cleared" in page.inner_text(".messagelist")
    assert "None: no kill switch stops this end user" in page.inner_text("#llmb-kill-switches")

    # A raise from the tenant page: the budget is chosen, the time picked in the tenant's zone.
    page.goto(tenant_url)
    page.click("#llmb-budgets tr:has-text('tenant acme') >> text=Raise…")
    assert page.locator("#id_budget option:checked").inner_text().startswith("tenant acme month")
    assert "Europe/Amsterdam" in page.inner_text(".form-row.field-until")
    ends = (timezone.now() + timedelta(days=3)).astimezone(acme_zone(acme))
    page.fill("#id_amount", "25")
    page.fill("#id_until_0", f"{ends:%Y-%m-%d}")
    page.fill("#id_until_1", "18:00:00")
    page.fill("#id_reason", "launch week, agreed with their CFO")
    screenshot(page, "raise-form")
    page.click("input[value='Grant the raise']")
    until = ends.replace(hour=18, minute=0, second=0, microsecond=0)
    message = page.inner_text(".messagelist")
    assert (
        message
        == f"Raise of 25.00 USD on tenant acme's month budget until {when(until, acme.timezone)}."
    )
    budget_row = " ".join(page.inner_text("#llmb-budgets tr:has-text('tenant acme')").split())
    assert f"75.00 USD of which 25.00 USD until {when(until, acme.timezone)}" in budget_row
    screenshot(page, "raise-granted")

    # Every screen at both widths: nothing to scroll sideways to, the key columns in view.
    lists = {
        "refusals": (
            "refusal",
            ["When", "Tenant", "End user", "Model", "Budget or switch", "Asked", "Left", "Resets"],
        ),
        "ledger": ("usagerecord", ["When", "Tenant", "End user", "Call", "Cost", "Note"]),
        "reservations": ("reservation", ["Reservation", "State", "Held"]),
        "budgets": ("budget", ["Budget", "Limit now", "Spent this period", "Remaining"]),
        "counters": ("counter", ["Budget", "End user", "Spent"]),
    }
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, url in [
            ("tenant-page", tenant_url),
            (
                "end-user-page",
                f"{base}{reverse('admin:llm_budgets_enduser_change', args=[alice.pk])}",
            ),
        ]:
            page.goto(url)
            screenshot(page, f"{name}-{width}")
            assert _overflow(page) == 0, (name, width)
        for name, (model, columns) in lists.items():
            page.goto(f"{base}{reverse(f'admin:llm_budgets_{model}_changelist')}")
            screenshot(page, f"{name}-list-{width}")
            assert _overflow(page) == 0, (name, width)
            shown = _visible_headers(page)
            assert all(c in shown for c in columns), (name, width, shown)
    context.close()


def acme_zone(tenant: Tenant) -> Any:
    from llm_budgets.clock import zone

    return zone(tenant.timezone)
