"""The support admin in a real browser (chromium through Playwright), at 1400 and 1920 px wide.

Walks what a new support person does with the demo data: the tenant page, an end user's page, the
refusals list, tripping and clearing a kill switch, granting a temporary raise; checks what the
screens say and that the lists' key columns fit, and keeps screenshots in
``test-artifacts/screenshots/`` (the ones in docs/support.md come from here)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from demo.demonstration import demo_data_load
from llm_budgets import budgets
from llm_budgets.billing.links import stripe_customer_link
from llm_budgets.clock import when
from llm_budgets.control.api_keys import api_key_create
from llm_budgets.engine.adjustments import usage_void
from llm_budgets.engine.admission import reservation_create
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import EndUser, Tenant, UsageKind, UsageRecord
from tests.browser import screenshot  # chromium_browser: the session fixture (conftest)

WIDTHS = (1400, 1920)
PASSWORD = "a-long-test-password"


# Long names a host may use: they must wrap, not widen the page (#14: 19 px too wide at 1400).
LONG_TAG = ("project", "customer-onboarding-assistant-eu-rollout")
LONG_RUN = "research-agent-2026-12-01-7f3c9e1b2d4a4c0e"


def support_data() -> None:
    """The demo data with its month of usage, API key / run / tag budgets with long names, a
    Stripe link, a burst of identical refusals and one voided line."""
    demo_data_load(admin=False, month=True)
    get_user_model().objects.create_superuser("maria", "maria@example.com", PASSWORD)
    key, _ = api_key_create(tenant="acme", name="support bot", actor="maria")
    budgets.set_limit(tenant="acme", tag=LONG_TAG, amount=Decimal(40), window="month")
    budgets.set_limit(tenant="acme", api_key=key.prefix, amount=Decimal(20), window="day")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal(3), window="lifetime")
    hold = reservation_create(
        tenant="acme",
        end_user="alice",
        provider="openai",
        model="gpt-4o-mini",
        input_tokens=20_000,
        max_output_tokens=2_000,
        run=LONG_RUN,
        tags=dict([LONG_TAG]),
        api_key=key,
    )
    budgets.commit(hold.pk, input_tokens=18_000, output_tokens=1_500)
    stripe_customer_link(tenant="acme", customer_id="cus_QxAcmeSupport42", actor="maria")
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


def _too_wide(page: Any) -> list[str]:
    """The innermost elements reaching past the window's right edge (for a failure message)."""
    return list(
        page.evaluate(
            """() => { const w = document.documentElement.clientWidth;
                return [...document.querySelectorAll('#content *')]
                  .filter(e => e.getBoundingClientRect().right > w + 1
                    && ![...e.children].some(c => c.getBoundingClientRect().right > w + 1))
                  .slice(0, 5)
                  .map(e => `${e.tagName}.${e.className} ${e.textContent.trim().slice(0, 60)}`);
            }"""
        )
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
    support_data()
    base = live_server.url
    acme = Tenant.objects.get(external_id="acme")
    alice = EndUser.objects.get(tenant=acme, external_id="alice")
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    # Django's nav sidebar open, as a new support person first sees it (and the screenshots in
    # docs/support.md show it); tests/test_admin_walk.py walks every page both ways.
    context.add_init_script("window.localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
    page = context.new_page()
    _log_in(page, base)
    tenant_url = f"{base}{reverse('admin:llm_budgets_tenant_change', args=[acme.pk])}"

    # The tenant page: one money format, the tenant's clock, refusals folded with a count.
    page.goto(tenant_url)
    assert page.locator("#main.shifted #nav-sidebar").count() == 1
    text = page.inner_text("#content")
    assert "Budgets: current period (times in Europe/Amsterdam)" in text
    assert "50.00 USD" in text  # acme's month limit, two places and the code
    assert "\u00d75" in page.inner_text("#llmb-refusals")  # "x5"  # the burst, grouped
    ledger = page.inner_text("#llmb-ledger")
    assert "voided by line" in ledger
    assert "“provider outage, refunded” by maria" in ledger
    assert "0.0000750000" not in text
    assert "UTC" not in page.inner_text("#llmb-budgets")
    scoped = page.inner_text("#llmb-scoped-budgets")
    assert f"tag {'='.join(LONG_TAG)} of acme" in scoped
    assert f"run {LONG_RUN} of acme" in scoped
    assert "Linked to Stripe customer cus_QxAcmeSupport42" in page.inner_text("#llmb-stripe")
    assert _overflow(page) == 0, _too_wide(page)
    screenshot(page, "tenant-page")

    # The refusals list: the burst is one row with its count.
    page.goto(f"{base}{reverse('admin:llm_budgets_refusal_changelist')}")
    bob = page.locator("#result_list tbody tr", has_text="bob").first
    assert "\u00d75" in bob.inner_text()

    # "View site": the usage pages, where support picks a tenant and lands on its overview.
    page.goto(tenant_url)
    page.click("text=View site")
    assert "Choose a tenant" in page.inner_text("main")
    screenshot(page, "pages-tenant-picker")
    page.click("text=Acme Corp")
    assert page.url.endswith("/usage/?tenant=acme")
    assert "Support view of this tenant." in page.inner_text("header")
    page.goto(tenant_url)

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
            ["When", "Who", "Model", "Budget or switch", "Asked", "Left", "Resets"],
        ),
        "ledger": ("usagerecord", ["When", "Tenant", "End user", "Call", "Cost", "Note"]),
        "reservations": ("reservation", ["Reservation", "State", "Held"]),
        "budgets": ("budget", ["Budget", "Limit now", "Spent now", "Remaining"]),
        "counters": ("counter", ["Budget", "End user", "Spent"]),
    }
    every_list = sorted(
        model._meta.model_name
        for model in admin.site._registry
        if model._meta.app_label == "llm_budgets"
    )
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
            assert _overflow(page) == 0, (name, width, _too_wide(page))
        for name, (model, columns) in lists.items():
            page.goto(f"{base}{reverse(f'admin:llm_budgets_{model}_changelist')}")
            screenshot(page, f"{name}-list-{width}")
            assert _overflow(page) == 0, (name, width, _too_wide(page))
            shown = _visible_headers(page)
            assert all(c in shown for c in columns), (name, width, shown)
        for model_name in every_list:  # every other list fits too
            page.goto(f"{base}{reverse(f'admin:llm_budgets_{model_name}_changelist')}")
            assert _overflow(page) == 0, (model_name, width, _too_wide(page))
    context.close()


def acme_zone(tenant: Tenant) -> Any:
    from llm_budgets.clock import zone

    return zone(tenant.timezone)
