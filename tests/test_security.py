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
from tests.api import BASE, client_for
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

    places = {
        "logs": "\n".join(record.getMessage() for record in caplog.records),
        "responses": "\n".join(bodies),
        "admin history": json.dumps(
            list(LogEntry.objects.values("object_repr", "change_message")), default=str
        ),
        "audit log": json.dumps(
            list(AuditEvent.objects.values("before", "after", "reason", "actor", "target")),
            default=str,
        ),
    }
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
        ("kill switch clear", change("killswitch", switch.pk), {"clear_reason": "x"}),
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
    budgets.ensure_tenant("acme")
    hold = reserve_30(end_user="u-1")
    budgets.commit(hold.id, input_tokens=0, output_tokens=10)
    tenant = Tenant.objects.get()
    switch = budgets.trip(tenant="acme", reason="t", actor="t")
    from llm_budgets.api.keys import api_key_create

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
    budgets.ensure_tenant("acme", name=HOSTILE)
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
