"""Every admin page in a real chromium, at 1400 and 1920 px, with Django's nav sidebar open and
closed (issue #27).

The pages come from the admin itself (``admin.site._registry`` and each ModelAdmin's
``get_urls``, ``get_actions``), so a newly registered model, custom view or action is walked
without editing this test: each changelist, the change page of one row, the add page, each custom
view (trip and clear a switch, resets, void), each action's intermediate page, the admin index
and the support picker ("View site"). Each fails on

- sideways scrolling inside the content (the page, ``#content`` or a list's own box wider than it
  shows), except inside a scroll region the house names (``role=region`` with a label, as the
  tenant and end-user pages' tables are);
- escaped HTML in the page's text (``&lt;span``, ``<span class=…>`` shown as text);
- a time or an amount not written by the app's one formatter (``llm_budgets.clock.when``,
  ``llm_budgets.money``): Django's ``Dec. 2, 2026, 5:12 a.m.``, ISO times, bare ``HH:MM``, raw
  ``0.6525000000``;
- on a list, a time in any zone but the staff user's (the active timezone): lists span tenants.

Every list's screenshot (1400 px, sidebar open) goes to ``test-artifacts/screenshots/walk/``,
every finding to ``test-artifacts/admin-walk.json``; docs/support.md's screenshots come from
tests/test_support_browser.py.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db.models import Model
from django.test import RequestFactory
from django.urls import URLPattern, reverse
from django.utils import timezone

from demo.stripe_demo import stripe_demo_run
from demo.usage_month import page_users_ensure
from llm_budgets import budgets
from llm_budgets.alerts.endpoints import endpoint_create, endpoint_test_send
from llm_budgets.billing.credits import balance_open
from llm_budgets.billing.topups import credit_grant
from llm_budgets.control.killswitches import kill_switch_trip, switch_scope
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.exceptions import KillSwitchActive
from llm_budgets.models import (
    AlertDelivery,
    AlertEndpoint,
    Budget,
    CreditAccount,
    KillSwitch,
    MeterDelivery,
    MeterErrorReport,
    Plan,
    Scope,
    StripeInvoice,
    StripePlanMeter,
    StripeWebhookEvent,
    Tenant,
    ThresholdCrossing,
    UsageRecord,
)
from llm_budgets.pricing.model_names import model_alias_set
from tests.browser import SCREENSHOTS, screenshot
from tests.test_support_a11y import _data as support_admin_data
from tests.test_support_browser import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The app's own admin (Django's and django-celery-beat's pages are theirs to format).
APP = "llm_budgets"
WIDTHS = (1400, 1920)
SIDEBAR_KEY = "django.admin.navSidebarIsOpen"
# Every finding of the last run, by page and state, for a person to read.
REPORT = SCREENSHOTS.parent / "admin-walk.json"
STANDARD_VIEWS = ("changelist", "add", "history", "delete", "change")

# The formatter's shapes: ``Tue 1 Dec 2026 12:10 CET`` (seconds optional), ``9,998.65 USD``.
DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
CLOCK = re.compile(
    rf"{DAY} \d{{1,2}} {MONTH} \d{{4}} \d{{2}}:\d{{2}}(?::\d{{2}})? ([A-Z][A-Za-z]*|[+-]\d+)"
)
FINDINGS = {
    "escaped HTML": re.compile(r"&(?:lt|gt|amp|quot|#\d+);|<\s*/?\s*[a-zA-Z][a-zA-Z0-9]*[\s>/]"),
    "Django's default datetime": re.compile(
        r"\b(?:Jan|Feb|March|April|May|June|July|Aug|Sept|Oct|Nov|Dec)\.? \d{1,2}, \d{4}"
        r"|\b\d{1,2}(?::\d{2})? [ap]\.m\.|\bmidnight\b|\bnoon\b"
    ),
    "ISO time": re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}"),
    "raw amount": re.compile(r"\b\d+\.\d{9,}\b"),
    "double full stop": re.compile(r"\w\.\.(?!\.)"),
    "amount without the formatter's separators": re.compile(r"\b\d{4,}\.\d+ [A-Z]{3}\b"),
}
# An amount with three or more places is a rate or money only when the currency follows.
LONG_DECIMAL = re.compile(r"\b\d+\.\d{3,}\b(?! [A-Z]{3}\b)")
# A time of day as a form's example value (``"09:00"`` in JSON help) is an input format.
BARE_TIME = re.compile(r'(?<!")\b\d{1,2}:\d{2}(?::\d{2})?\b(?!")')

# What the page tells the test, in one round trip.
PROBE = """() => {
  const root = document.querySelector('main') || document.body;
  const named = e => e.closest('[role=region][aria-labelledby], [role=region][aria-label]');
  const wide = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) {
    wide.push(`page ${doc.scrollWidth} > ${doc.clientWidth}`);
  }
  const clips = e => { for (let a = e.parentElement; a && a !== root; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') return true; } return false; };
  const content = document.getElementById('content');
  const right = content ? content.getBoundingClientRect().right : doc.clientWidth;
  for (const e of [root, ...root.querySelectorAll('*')]) {
    if (['INPUT', 'TEXTAREA', 'SELECT', 'OPTION'].includes(e.tagName) || named(e)) continue;
    // Text for screen readers only (Django 6's list headings) is clipped to a pixel by design.
    if (e.closest('.visually-hidden')) continue;
    // The index's "Recent actions" column hangs in #content's margin by Django's design.
    if (e.closest('#content-related')) continue;
    const box = getComputedStyle(e).overflowX !== 'visible' || e.classList.contains('results');
    if (box && e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 2) {
      const columns = [...e.querySelectorAll('thead th')]
        .map(th => `${th.textContent.trim()} ${Math.round(th.getBoundingClientRect().width)}`);
      wide.push(`${e.tagName}#${e.id}.${e.className} ${e.scrollWidth} > ${e.clientWidth}`
        + (columns.length ? ` (columns: ${columns.join(', ')})` : ''));
    } else if (!box && content && content.contains(e) && e !== content && !clips(e)
        && e.getBoundingClientRect().right > right + 1) {
      const text = e.textContent.trim().slice(0, 40);
      wide.push(`${e.tagName}.${e.className} past #content's edge: ${text}`);
    }
  }
  wide.splice(5);
  const main = document.getElementById("main");
  return {
    text: root.innerText,
    wide: wide,
    sidebar: !!document.getElementById('nav-sidebar'),
    shifted: !!main && main.classList.contains('shifted'),
    list: !!document.getElementById('changelist'),
    // Lists of rows across tenants, or of changes by staff: the staff user's zone.
    staff: !!document.querySelector('#changelist, #change-history'),
    // Payloads shown as sent (an alert's JSON body): the wire's format, not the one for people.
    wire: [...root.querySelectorAll('[data-wire]')].map(e => e.innerText),
  };
}"""


def walk_data() -> None:
    """The support admin's data (tests/test_support_a11y.py), the demo's Stripe run (a link,
    deliveries, billing lines, a meter, a reconciliation run) and a row of each model those
    leave empty."""
    support_admin_data()
    stripe_demo_run()
    page_users_ensure(PASSWORD)
    # A reason typed as a sentence (its full stop is not doubled on the clear page), and a
    # refusal by that switch (its message names when it was tripped).
    scope = switch_scope(tenant="acme", end_user="bob")
    assert scope is not None
    kill_switch_trip(scope=scope, reason="runaway loop, waiting for a fix.", actor="maria")
    with pytest.raises(KillSwitchActive):
        budgets.reserve(
            tenant="acme",
            end_user="bob",
            provider="openai",
            model="gpt-4o-mini",
            input_tokens=10,
            max_output_tokens=10,
        )
    acme = Tenant.objects.get(external_id="acme")
    now = timezone.now()
    budget = Budget.objects.get(tenant=acme, scope=Scope.TENANT, window="month")
    budget_raise_grant(
        budget=budget,
        amount=Decimal(25),
        until=now + timedelta(days=3),
        reason="launch week",
        actor="maria",
    )
    model_alias_set(pattern="gpt-4o-2099-*", model="gpt-4o", provider="openai", actor="maria")
    plan = Plan.objects.order_by("pk").first()
    assert plan is not None
    StripePlanMeter.objects.create(plan=plan, event_name="llm_usage")
    # A change made in the admin, for the plan's history page.
    LogEntry.objects.log_actions(
        user_id=get_user_model().objects.get(username="maria").pk,
        queryset=Plan.objects.filter(pk=plan.pk),
        action_flag=CHANGE,
        change_message="Changed markup percent.",
    )
    # What the warning scan records (its rules are tests/test_thresholds.py's).
    ThresholdCrossing.objects.create(
        budget=budget,
        tenant=acme,
        period_start=now - timedelta(days=3),
        threshold=80,
        limit=Decimal(50),
        spent=Decimal("40.6525"),
        reserved=Decimal("0.1"),
        crossed_at=now,
        recipients="billing@acme.example",
    )
    # What Stripe's webhooks leave (their processing is tests/test_stripe_webhooks.py's).
    event = StripeWebhookEvent.objects.create(
        id="evt_walk_1",
        type="invoice.payment_failed",
        body=b"{}",
        received_at=now,
        state="processed",
        processed_at=now,
        attempts=1,
        outcome="switch tripped",
    )
    # One Stripe sent that could not be read (its change page is the one walked: first by pk): a
    # long line, as received.
    odd = {"id": "evt_walk_0", "type": "payment_intent.succeeded", "data": {"object": {}}}
    odd["data"]["object"] = {"metadata": ["llmb_top_up"], "description": "x\u0000" * 600}
    StripeWebhookEvent.objects.create(
        id="evt_walk_0",
        type="payment_intent.succeeded",
        body=json.dumps(odd).encode(),
        received_at=now,
        state="unprocessable",
        attempts=1,
        error="data.object.metadata must be an object; got a list.",
        outcome="unprocessable",
    )
    StripeInvoice.objects.create(
        tenant=acme, invoice_id="in_walk_1", payment_failed_at=now, failed_event=event.id
    )
    MeterErrorReport.objects.create(
        delivery=MeterDelivery.objects.order_by("pk").first(),
        identifier="walk-1",
        code="no_meter",
        message="No active meter found",
        webhook_event=event,
        created_at=now,
    )
    # Alerts: the billing contacts' email endpoint, a webhook and its test event's delivery.
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.example")
    webhook, _ = endpoint_create(
        tenant=acme,
        kind="webhook",
        target="https://hooks.acme.example/llm-budgets",
        event_types=["threshold.crossed", "budget.exhausted", "kill_switch.tripped"],
        description="Acme's on-call bot",
        actor="maria",
    )
    endpoint_test_send(webhook, actor="maria")
    # A prepaid balance (docs/billing.md) with a promotional grant, on a tenant of its own.
    budgets.ensure_tenant(tenant="prepaid-co", name="Prepaid Co")
    balance_open(tenant="prepaid-co", actor="maria")
    credit_grant(
        tenant="prepaid-co",
        amount=Decimal(50),
        expires_at=now + timedelta(days=30),
        actor="maria",
        reason="free trial",
    )


def _request(user: Any) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def _first(model: type[Model]) -> Model | None:
    return model._default_manager.order_by("pk").first()


def _kwargs_for(pattern: URLPattern) -> dict[str, Any]:
    """Values for a custom admin view's URL arguments, one row each (a new argument name fails
    here: say which row it takes)."""
    acme = Tenant.objects.get(external_id="acme")
    rows: dict[str, Any] = {
        "tenant_id": acme.pk,
        "switch_id": KillSwitch.objects.filter(cleared_at__isnull=True).order_by("-pk").first(),
        "budget_id": Budget.objects.filter(tenant=acme, scope=Scope.TENANT).first(),
        "line_id": UsageRecord.objects.filter(tenant=acme, voids__isnull=True).last(),
        "endpoint_id": AlertEndpoint.objects.filter(kind="webhook").first(),
        "delivery_id": AlertDelivery.objects.first(),
        "account_id": CreditAccount.objects.first(),
    }
    kwargs = {}
    for name in pattern.pattern.regex.groupindex:
        assert name in rows, f"teach the walk which row {pattern.name}'s <{name}> takes"
        value = rows[name]
        kwargs[name] = value.pk if isinstance(value, Model) else value
    return kwargs


def admin_pages(user: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Every page of the admin as ``(name, path)``, and every action as
    ``(name, changelist path, action)``."""
    request = _request(user)
    pages = [("index", reverse("admin:index")), ("support picker", str(admin.site.site_url))]
    actions = []
    empty = []
    registry = [(m, a) for m, a in admin.site._registry.items() if m._meta.app_label == APP]
    for model, model_admin in sorted(registry, key=lambda item: item[0]._meta.label):
        label = model._meta.label_lower
        info = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        if not model_admin.has_view_or_change_permission(request):
            continue
        changelist = reverse(f"{info}_changelist")
        pages.append((f"{label} list", changelist))
        row = _first(model)
        if row is None:
            empty.append(label)
        else:
            pages.append((f"{label} change", reverse(f"{info}_change", args=[quote(row.pk)])))
            pages.append((f"{label} history", reverse(f"{info}_history", args=[row.pk])))
        if model_admin.has_add_permission(request):
            pages.append((f"{label} add", reverse(f"{info}_add")))
        for pattern in model_admin.get_urls():
            name = getattr(pattern, "name", None)
            if not name or name.endswith(tuple(f"_{view}" for view in STANDARD_VIEWS)):
                continue
            pages.append((f"{label} {name}", reverse(f"admin:{name}", kwargs=_kwargs_for(pattern))))
        if row is not None:
            actions += [
                (f"{label} action {a}", changelist, a) for a in model_admin.get_actions(request)
            ]
    assert not empty, f"no row to open the change page of: add one to walk_data(): {empty}"
    return pages, actions


def problems(probe: dict[str, Any], *, zones: set[str]) -> list[str]:
    """What is wrong on a page (the probe's answer), as lines for the failure message."""
    text = probe["text"]
    for payload in probe["wire"]:
        text = text.replace(payload, "")
    found = [f"scrolls sideways: {w}" for w in probe["wide"]]
    for name, pattern in FINDINGS.items():
        found += [f"{name}: {m!r} in …{_around(text, m)}…" for m in _matches(pattern, text)]
    clocks = list(CLOCK.finditer(text))
    in_clocks = {i for m in clocks for i in range(m.start(), m.end())}
    for m in BARE_TIME.finditer(text):
        if m.start() not in in_clocks:
            found.append(f"time not in the one format: {m[0]!r} in …{_around(text, m[0])}…")
    found += [f"raw amount: {m!r} in …{_around(text, m)}…" for m in _matches(LONG_DECIMAL, text)]
    if probe["staff"]:
        found += [
            f"a list shows {m[0]!r}, not in the staff user's zone"
            for m in clocks
            if m[1] not in zones
        ]
    return found


def _matches(pattern: re.Pattern[str], text: str) -> list[str]:
    return list(dict.fromkeys(m[0] for m in pattern.finditer(text)))[:3]


def _around(text: str, found: str) -> str:
    at = text.find(found)
    return text[max(0, at - 40) : at + len(found) + 40].replace("\n", " ")


def _staff_zone_labels() -> set[str]:
    """The labels the active zone's times carry (both sides of a DST change)."""
    now = timezone.now()
    zone = timezone.get_current_timezone()
    return {(now + timedelta(days=d)).astimezone(zone).strftime("%Z") for d in range(0, 366, 30)}


def _context(browser: Any, width: int, sidebar_open: bool, state: Any) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900}, storage_state=state)
    context.set_default_timeout(15_000)
    # nav_sidebar.js reads this on every page: open unless it is "false".
    context.add_init_script(
        f"window.localStorage.setItem('{SIDEBAR_KEY}', '{str(sidebar_open).lower()}')"
    )
    return context


def test_every_admin_page_fits_and_speaks_one_format(
    chromium_browser: Any, live_server: Any
) -> None:
    walk_data()
    user = get_user_model().objects.get(username="maria")
    pages, actions = admin_pages(user)
    base = live_server.url
    zones = _staff_zone_labels()
    login = chromium_browser.new_context()
    page = login.new_page()
    page.goto(f"{base}{reverse('admin:login')}")
    page.fill("#id_username", "maria")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    state = login.storage_state()
    login.close()

    failures: dict[str, list[str]] = {}
    walked = {}
    started = time.monotonic()
    states = [(w, s) for w in WIDTHS for s in (True, False)]
    for width, sidebar_open in states:
        context = _context(chromium_browser, width, sidebar_open, state)
        page = context.new_page()
        where = f"@{width} sidebar {'open' if sidebar_open else 'closed'}"
        count = 0
        for name, path in pages:
            response = page.goto(f"{base}{path}")
            assert response is not None, (name, where)
            assert response.ok, (name, where, response.status)
            probe = page.evaluate(PROBE)
            if probe["sidebar"]:
                assert probe["shifted"] == sidebar_open, (name, where, "the sidebar state")
            if found := problems(probe, zones=zones):
                failures[f"{name} {where}"] = found
            if sidebar_open and probe["list"] and width == 1400:
                screenshot(page, f"walk/{name.replace(' ', '-').replace('.', '-')}-{width}")
            count += 1
        walked[where] = count
        context.close()

    intermediate: set[str] = set()
    # Actions last: some write (revoke, unlink, retry), and no page above should see that.
    for width, sidebar_open in states:
        context = _context(chromium_browser, width, sidebar_open, state)
        page = context.new_page()
        where = f"@{width} sidebar {'open' if sidebar_open else 'closed'}"
        for name, changelist, action in actions:
            page.goto(f"{base}{changelist}")
            page.locator("#result_list tbody input.action-select").first.check()
            page.select_option("select[name=action]", action)
            with page.expect_navigation():
                page.click("button[name=index]")
            probe = page.evaluate(PROBE)
            if probe["list"]:
                continue  # done at once, no intermediate page
            intermediate.add(name)
            walked[where] += 1
            if found := problems(probe, zones=zones):
                failures[f"{name} {where}"] = found
        context.close()

    elapsed = time.monotonic() - started
    print(
        f"{len(pages)} pages and {len(actions)} actions ({len(intermediate)} with a page of "
        f"their own), walked {walked} in {elapsed:.0f} s"
    )
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"walked": walked, "failures": failures}, indent=1))
    assert not failures, "\n".join(
        f"{page}:\n  " + "\n  ".join(lines) for page, lines in sorted(failures.items())
    )
    assert all(n >= len(pages) for n in walked.values()), walked
