"""Security posture (issue #17 item 7): the production settings example passes
``check --deploy``; no secret reaches logs, errors, the admin's change history or the audit log;
every admin write that changes money or access refuses a staff user without its permission and
leaves nothing behind."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.exceptions import KillSwitchActive
from llm_budgets.models import (
    ApiKey,
    AuditEvent,
    Budget,
    BudgetRaise,
    KillSwitch,
    Price,
    Tenant,
    UsageRecord,
)
from tests.api import BASE, client_for, new_key
from tests.factories import reserve_30, seed
from tests.servers import ROOT

pytestmark = pytest.mark.django_db


def test_the_production_settings_example_passes_check_deploy() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.production",
        "SECRET_KEY": secrets.token_urlsafe(60),
        "ALLOWED_HOSTS": "budgets.example.com",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    # X-Forwarded-For is believed only behind proxies the deployment declares: none by default.
    read = [sys.executable, "manage.py", "shell", "-c", "from llm_budgets.conf import conf; "
            "print(conf.TRUSTED_PROXIES)"]  # fmt: skip
    for declared, trusted in ((None, "0"), ("1", "1")):
        extra = {} if declared is None else {"TRUSTED_PROXIES": declared}
        shown = subprocess.run(
            read, cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=120
        )
        assert shown.stdout.split()[-1:] == [trusted], shown.stdout + shown.stderr


def _logged_in(**fields: object) -> tuple[Client, Any]:
    user = get_user_model().objects.create_user(password=None, **fields)
    client = Client()
    client.force_login(user)
    return client, user


def test_no_api_key_secret_in_logs_errors_history_or_audit(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    seed()
    admin, _ = _logged_in(username="root", is_staff=True, is_superuser=True)
    add = admin.post(
        reverse("admin:llm_budgets_apikey_add"),
        {"name": "svc", "tenant": Tenant.objects.get().pk, "_save": "1"},
        follow=True,
    )
    assert add.status_code == 200
    shown = next(m.message for m in add.context["messages"] if "API key is" in m.message)
    key = shown.split("The API key is: ")[1].split(" ")[0]
    prefix, secret = key.split(".")
    api_key = ApiKey.objects.get(prefix=prefix)
    bodies = []
    for header in (f"Api-Key {key}", f"Api-Key {prefix}.{secret[:-1]}x", f"api-key {key}"):
        response = client_for(None)
        response.credentials(HTTP_AUTHORIZATION=header)
        bodies.append(response.get(f"{BASE}tenants/acme/status").content.decode())
        bodies.append(
            response.post(
                f"{BASE}reservations", {"model": "m30", "bad": 1}, format="json"
            ).content.decode()
        )
    budgets.trip(api_key=prefix, reason="leak test", actor="t")
    revoke = admin.post(
        reverse("admin:llm_budgets_apikey_changelist"),
        {"action": "revoke", "_selected_action": [api_key.pk]},
    )
    assert revoke.status_code == 302
    after = client_for(key).get(f"{BASE}tenants/acme/status")
    assert after.status_code == 401
    bodies.append(after.content.decode())

    places = _places(caplog, bodies, [])
    assert AuditEvent.objects.exists()
    assert LogEntry.objects.exists()
    for place, text in places.items():
        assert secret not in text, place
        assert secret[:-1] not in text, place  # nor the wrong secret that was tried
        assert api_key.hashed_key not in text, place


# Every admin write that changes money or access: (name, method, url, data).
def _writes(tenant: Tenant, budget: Budget, switch: KillSwitch, key: ApiKey, line: Any) -> list:
    change = lambda model, pk: reverse(f"admin:llm_budgets_{model}_change", args=[pk])  # noqa: E731
    add = lambda model: reverse(f"admin:llm_budgets_{model}_add")  # noqa: E731
    return [
        ("budget add", add("budget"), {"tenant": tenant.pk, "window": "day", "limit": "5"}),
        ("budget change", change("budget", budget.pk), {"limit": "500", "reason": "x"}),
        ("raise add", add("budgetraise"), {"budget": budget.pk, "amount": "5", "reason": "x"}),
        ("kill switch trip", add("killswitch"), {"tenant": tenant.pk, "reason": "x"}),
        ("kill switch clear", change("killswitch", switch.id), {"clear_reason": "x"}),
        ("api key add", add("apikey"), {"name": "k", "tenant": tenant.pk}),
        (
            "api key revoke",
            reverse("admin:llm_budgets_apikey_changelist"),
            {"action": "revoke", "_selected_action": [key.pk]},
        ),
        ("price add", add("price"), {"provider": "p", "model": "m", "input_per_mtok": "1"}),
        ("tenant change", change("tenant", tenant.pk), {"markup_percent": "50"}),
        (
            "spend reset",
            reverse("admin:llm_budgets_tenant_reset_end_user", args=[tenant.pk]),
            {"end_user": "u-1", "reason": "x"},
        ),
        (
            "ledger void",
            reverse("admin:llm_budgets_tenant_void_line", args=[tenant.pk, line.pk]),
            {"reason": "x"},
        ),
    ]


def _state() -> list[Any]:
    return [
        list(Budget.objects.values_list("pk", "limit")),
        BudgetRaise.objects.count(),
        list(KillSwitch.objects.values_list("pk", "cleared_at")),
        list(ApiKey.objects.values_list("pk", "revoked")),
        Price.objects.count(),
        list(Tenant.objects.values_list("pk", "markup_percent")),
        UsageRecord.objects.count(),
        AuditEvent.objects.count(),
        LogEntry.objects.count(),
    ]


def test_every_money_or_access_write_in_the_admin_needs_its_permission() -> None:
    seed()
    budgets.ensure_tenant(tenant="acme")
    hold = reserve_30(end_user="u-1")
    budgets.commit(hold.id, input_tokens=0, output_tokens=10)
    tenant = Tenant.objects.get()
    switch = budgets.trip(tenant="acme", reason="t", actor="t")
    from llm_budgets.control.api_keys import api_key_create

    key, _ = api_key_create(tenant="acme", name="k")
    writes = _writes(tenant, Budget.objects.first(), switch, key, UsageRecord.objects.first())
    # A staff member who may see everything and change nothing.
    client, user = _logged_in(username="viewer", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    before = _state()
    for name, url, data in writes:
        response = client.post(url, {**data, "_save": "1"})
        refused = response.status_code == 403 or (
            # The changelist answers an unknown action with a redirect and does nothing.
            name == "api key revoke" and response.status_code in (200, 302)
        )
        assert refused, (name, response.status_code)
        assert _state() == before, name


HOSTILE = '<script>alert("x")</script>'


def test_names_and_tags_with_html_are_escaped_in_the_admin() -> None:
    seed()
    budgets.ensure_tenant(tenant="acme", name=HOSTILE)
    hold = reserve_30(end_user=f"u{HOSTILE}", tags={"feature": HOSTILE})
    budgets.commit(hold.id, input_tokens=0, output_tokens=10)
    admin, _ = _logged_in(username="root", is_staff=True, is_superuser=True)
    tenant = Tenant.objects.get()
    reservation = hold.id
    pages = [
        reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]),
        reverse("admin:llm_budgets_tenant_changelist"),
        reverse("admin:llm_budgets_reservation_change", args=[reservation]),
        reverse("admin:llm_budgets_reservation_changelist"),
        reverse("admin:llm_budgets_usagerecord_changelist"),
        reverse("admin:llm_budgets_enduser_changelist"),
        reverse("admin:llm_budgets_auditevent_changelist"),
    ]
    for url in pages:
        response = admin.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert HOSTILE not in html, url
    # The escaped text is there: shown, not executed.
    page = admin.get(pages[2]).content.decode()
    assert "&lt;script&gt;" in page


def _places(caplog: Any, bodies: list[str], errors: list[str]) -> dict[str, str]:
    """Every place a secret could leak to, as text: logs, responses, stored errors, the admin's
    change history and the audit log."""
    from llm_budgets.models import MeterDelivery, StripeWebhookEvent

    errors = [
        *errors,
        *MeterDelivery.objects.values_list("error_message", flat=True),
        *MeterDelivery.objects.values_list("note", flat=True),
        *StripeWebhookEvent.objects.values_list("error", flat=True),
    ]
    return {
        "logs": "\n".join(
            f"{record.getMessage()} {record.exc_text or ''}" for record in caplog.records
        ),
        "responses": "\n".join(bodies),
        "errors": "\n".join(errors),
        "admin history": json.dumps(
            list(LogEntry.objects.values("object_repr", "change_message")), default=str
        ),
        "audit log": json.dumps(
            list(AuditEvent.objects.values("before", "after", "reason", "actor", "target")),
            default=str,
        ),
    }


def test_no_stripe_key_or_webhook_secret_in_logs_errors_history_or_audit(
    caplog: Any, settings: Any
) -> None:
    """The Stripe secret key (a refused one and the right one), and the webhook signing secret,
    through every path that talks about them: pushes refused, retried and sent, webhooks signed
    right and wrong, the admin's billing pages and retry action, and the settings checks."""
    from datetime import timedelta

    import time_machine
    from django.core import checks
    from django.utils import timezone

    from llm_budgets.billing.stripe_push import stripe_push
    from llm_budgets.models import MeterDelivery, MeterDeliveryState
    from llm_budgets.testing.fakes.stripe_server import StripeServer
    from tests.stripe_support import event, set_up, sign, stripe_settings

    caplog.set_level(logging.DEBUG)
    refused_key = f"rk_test_{secrets.token_hex(16)}"  # the fake refuses restricted keys: 401
    stripe_key = f"sk_test_{secrets.token_hex(16)}"
    webhook_secret = f"whsec_{secrets.token_hex(16)}"
    admin, _ = _logged_in(username="root", is_staff=True, is_superuser=True)
    bodies: list[str] = []
    with StripeServer() as fake:
        base = stripe_settings(fake.base_url, STRIPE_WEBHOOK_SECRET=webhook_secret)
        settings.LLM_BUDGETS = {**base, "STRIPE_API_KEY": stripe_key}
        with time_machine.travel(timezone.now() - timedelta(hours=2), tick=False):
            cid = set_up(fake)
            reserve_30().commit(input_tokens=0, output_tokens=100)
        settings.LLM_BUDGETS = {**base, "STRIPE_API_KEY": refused_key}
        assert stripe_push().parked == 1  # Stripe refused the key
        delivery = MeterDelivery.objects.get()
        changelist = reverse("admin:llm_budgets_meterdelivery_changelist")
        retried = admin.post(changelist, {"action": "retry", "_selected_action": [delivery.pk]})
        assert retried.status_code == 302
        settings.LLM_BUDGETS = {**base, "STRIPE_API_KEY": stripe_key}
        fake.inject("/v1/billing/meter_events", "500", "drop_after")
        assert stripe_push().retrying == 1
        later = timezone.now() + timedelta(minutes=10)
        assert stripe_push(now=later).retrying == 1  # dropped after Stripe recorded it
        assert stripe_push(now=later + timedelta(hours=1)).sent == 1  # the replay
        assert MeterDelivery.objects.get().state == MeterDeliveryState.SENT

        paid = event("invoice.paid", {"id": "in_1", "customer": cid})
        wrong = sign(paid, secret=f"whsec_{secrets.token_hex(16)}")
        deleted = event("customer.deleted", {"id": cid, "object": "customer"}, "evt_2")
        for payload, signature in ((paid, wrong), (paid, sign(paid, webhook_secret))):
            bodies.append(_webhook(payload, signature))
        bodies.append(_webhook(deleted, sign(deleted, webhook_secret)))
        for name in ("meterdelivery", "stripewebhookevent", "stripecustomerlink", "tenant"):
            page = admin.get(reverse(f"admin:llm_budgets_{name}_changelist"))
            assert page.status_code == 200, name
            bodies.append(page.content.decode())
        bodies.append(admin.get(reverse("admin:index")).content.decode())
        bodies.append(
            admin.get(
                reverse("admin:llm_budgets_meterdelivery_change", args=[delivery.pk])
            ).content.decode()
        )
    assert AuditEvent.objects.filter(action="stripe.unlink").exists()
    # A secret in the wrong setting (each the other's shape): the checks do not echo it.
    settings.LLM_BUDGETS = {"STRIPE_API_KEY": webhook_secret, "STRIPE_WEBHOOK_SECRET": stripe_key}
    # No database checks: Django 6.1 runs the model checks against every alias when none is
    # named, and the 'replica' alias is outside this test's transaction.
    found = checks.run_checks(databases=[])
    assert {"llm_budgets.E070", "llm_budgets.E073"} <= {m.id for m in found}, found
    errors = [f"{m.msg} {m.hint}" for m in found]

    for place, text in _places(caplog, bodies, errors).items():
        for secret in (refused_key, stripe_key, webhook_secret):
            assert secret not in text, (place, secret[:8])
            assert secret.split("_")[-1] not in text, (place, secret[:8])  # nor its random part


def _webhook(payload: bytes, signature: str) -> str:
    response = Client().post(
        "/api/llm-budgets/v1/stripe/webhook",
        payload,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=signature,
    )
    return f"{response.status_code} {response.content.decode()}"


def test_no_provider_api_key_in_logs_errors_or_the_ledger(caplog: Any) -> None:
    """The host's OpenAI and Anthropic keys pass through the guards: not into logs, the errors
    the guard raises, reservations, ledger lines, refusals or the audit log."""
    import anthropic
    import openai

    from llm_budgets.integrations import anthropic as anthropic_guard
    from llm_budgets.integrations import openai as openai_guard
    from llm_budgets.models import Refusal, Reservation
    from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
    from llm_budgets.testing.fakes.openai_server import FakeOpenAI
    from tests.integrations import CLAUDE, GPT, seed_tenant

    caplog.set_level(logging.DEBUG)
    seed_tenant()
    keys = {
        "openai": f"sk-proj-{secrets.token_hex(16)}",
        "anthropic": f"sk-ant-{secrets.token_hex(16)}",
    }
    errors: list[str] = []
    fakes = [FakeOpenAI(), FakeAnthropic()]
    try:
        gpt = openai_guard.guard(
            openai.OpenAI(
                base_url=f"{fakes[0].base_url}/v1", api_key=keys["openai"], max_retries=0
            ),
            tenant="acme",
            end_user="u-1",
        )
        claude = anthropic_guard.guard(
            anthropic.Anthropic(
                base_url=fakes[1].base_url, api_key=keys["anthropic"], max_retries=0
            ),
            tenant="acme",
            end_user="u-1",
        )
        calls = [
            lambda: gpt.chat.completions.create(  # type: ignore[attr-defined]
                model=GPT, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=50
            ),
            lambda: claude.messages.create(  # type: ignore[attr-defined]
                model=CLAUDE, messages=[{"role": "user", "content": "hi"}], max_tokens=50
            ),
        ]
        for fake, call in zip(fakes, calls, strict=True):
            call()  # answered and charged
            fake.then(kind="status", status=401)
            fake.then(kind="drop")
            fake.then(kind="status", status=500)
            for _ in range(3):
                with pytest.raises(Exception) as raised:  # noqa: PT011 - the SDK's own errors
                    call()
                errors.append(f"{raised.value!r} {raised.value}")
        budgets.trip(tenant="acme", reason="t", actor="t")
        with pytest.raises(KillSwitchActive) as refused:
            calls[0]()
        errors.append(f"{refused.value!r} {refused.value}")
    finally:
        for fake in fakes:
            fake.stop()
    rows = json.dumps(
        [
            list(Reservation.objects.values()),
            list(UsageRecord.objects.values()),
            list(Refusal.objects.values()),
        ],
        default=str,
    )
    places = _places(caplog, [rows], errors)
    assert UsageRecord.objects.count() == 2
    for place, text in places.items():
        for key in keys.values():
            assert key not in text, place
            assert key.split("-")[-1] not in text, place


# --- Cache-Control: no-store on every API response (issue 38) ----------------------------------


def test_every_view_of_the_api_sends_no_store() -> None:
    """Each view mounted under the API's prefix is one that sets it (a new view that is not an
    ApiView, nor wrapped, fails here)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    from llm_budgets.api import urls
    from llm_budgets.api.views import NoStore

    def views(patterns: list[Any]) -> list[Any]:
        found = []
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                found += views(pattern.url_patterns)
            elif isinstance(pattern, URLPattern):
                found.append(pattern.callback)
        return found

    assert get_resolver().resolve(BASE + "health").func.__module__ == "llm_budgets.api.health"
    for callback in views(urls.urlpatterns):
        view_class = getattr(callback, "cls", None)
        if view_class is not None:
            assert issubclass(view_class, NoStore), view_class
        else:
            assert callback.__wrapped__.__name__ in {"stripe_webhook", "email_confirm"}


def test_api_answers_and_errors_are_never_cached(settings: Any) -> None:
    seed()
    key = client_for(new_key("acme", name="k"))
    body = {"provider": "fake", "model": "m30", "input_tokens": 0, "max_output_tokens": 1000}
    answers = {
        "created": key.post(BASE + "reservations", body, format="json"),
        "read": key.get(BASE + "tenants/acme/status"),
        "bad body": key.post(BASE + "reservations", {"colour": 1}, format="json"),
        "no key": client_for(None).get(BASE + "tenants/acme/status"),
        "bad key": client_for("nope.nope").get(BASE + "tenants/acme/status"),
        "not found": key.get(BASE + "no/such/path"),
        "another tenant": key.get(BASE + "tenants/globex/status"),
        "operators only": key.post(BASE + "kill-switches", {}, format="json"),
        "health": client_for(None).get(BASE + "health"),
        "webhook": Client().post(BASE + "stripe/webhook", b"{}", content_type="application/json"),
    }
    first = key.post(BASE + "reservations", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    answers["replayed"] = key.post(
        BASE + "reservations", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1"
    )
    assert first.status_code == 201
    assert answers["replayed"].has_header("Idempotent-Replayed")
    settings.LLM_BUDGETS = {**settings.LLM_BUDGETS, "API_THROTTLE_RATE": "1/minute"}
    from django.core.cache import cache

    cache.clear()
    key.get(BASE + "tenants/acme/status")
    answers["throttled"] = key.get(BASE + "tenants/acme/status")
    assert answers["throttled"].status_code == 429
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert {200, 201, 400, 401, 403, 404, 429} <= set(statuses.values()), statuses
    for name, answer in answers.items():
        assert answer.get("Cache-Control") == "no-store", (name, answer.status_code)
