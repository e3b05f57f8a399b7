"""A host project's own tests of its llm_budgets integration, with the kit
(``pytest_plugins = ["llm_budgets.testing.pytest"]``). Generated into each host of the matrix
(tests/hosts/generate.py) and run there; ``settings.HOST_CASE`` names the host's convention."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
import time_machine
from django.apps import apps
from django.contrib import admin
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.models import UsageRecord
from tests.conftest import client_for, make_user

PAGES = ["overview", "models", "users", "refusals", "export"]
API = "/api/llm-budgets/v1"


def test_llm_budgets_is_the_checkouts() -> None:
    import os

    import llm_budgets

    assert llm_budgets.__file__.startswith(os.environ["LLMB_EXPECTED_ROOT"]), llm_budgets.__file__


@pytest.mark.django_db  # some checks read the database (e.g. Stripe links without a key)
def test_check_passes() -> None:
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)  # raises SystemCheckError on any error
    assert "ERROR" not in out.getvalue(), out.getvalue()


@pytest.mark.django_db
def test_every_admin_changelist_answers_a_search(people) -> None:
    client = client_for(make_user("root", superuser=True))
    broken = []
    for model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist") + "?q=x"
        try:
            status = client.get(url).status_code
        except Exception as exc:  # the test client re-raises a view's exception
            status = f"{type(exc).__name__}: {exc}"
        if status != 200:
            broken.append((url, status))
    assert not broken, broken


@pytest.mark.django_db
def test_pages_for_tenant_admin_member_and_support(people) -> None:
    seen = {}
    for role in ("admin", "member"):
        client = client_for(people[role])
        for page in PAGES:
            seen[role, page] = client.get(reverse(f"llm_budgets_pages:{page}")).status_code
        seen[role, "tenants"] = client.get(reverse("llm_budgets_pages:tenants")).status_code
    support = client_for(people["support"])
    for page in PAGES:
        url = reverse(f"llm_budgets_pages:{page}") + "?tenant=acme"
        seen["support", page] = support.get(url).status_code
    seen["support", "picker"] = support.get(reverse("llm_budgets_pages:overview")).status_code
    seen["support", "tenants"] = support.get(reverse("llm_budgets_pages:tenants")).status_code
    expected = {key: 403 if key[1] == "tenants" and key[0] != "support" else 200 for key in seen}
    assert seen == expected


@pytest.mark.django_db
def test_api_reserve_then_commit(people) -> None:
    out = io.StringIO()
    call_command("llm_budgets_create_api_key", "--tenant", "acme", stdout=out, stderr=io.StringIO())
    key = out.getvalue().strip().splitlines()[-1]
    client = Client(HTTP_AUTHORIZATION=f"Api-Key {key}")
    for n in range(8):  # more than a strict host's anonymous throttle would let through
        held = client.post(
            f"{API}/reservations",
            {
                "provider": "openai",
                "model": "gpt-4o",
                "end_user": "u-17",
                "input_tokens": 1200,
                "max_output_tokens": 800,
            },
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=f"job-{n}",
        )
        assert held.status_code == 201, held.content
        done = client.post(
            f"{API}/reservations/{held.json()['id']}/commit",
            {"input_tokens": 1200, "output_tokens": 310},
            content_type="application/json",
        )
        assert done.status_code == 200, done.content
        assert done.json()["state"] == "committed"
    assert Client().post(
        f"{API}/reservations", {}, content_type="application/json"
    ).status_code in (
        401,
        403,
    )


@pytest.mark.django_db
def test_schedule_install() -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("llm_budgets_install_schedule", stdout=out, stderr=err)
    if not apps.is_installed("django_celery_beat"):
        assert "BEAT_SCHEDULE" in err.getvalue()
        return
    from django_celery_beat.models import PeriodicTask

    from llm_budgets.schedule import JOBS

    assert {job.name for job in JOBS} <= set(PeriodicTask.objects.values_list("name", flat=True))


def guarded_call(user, fake) -> bytes:
    response = client_for(user).get("/chat/?q=hi")
    assert response.status_code == 200
    # Read to the end: the test client then closes the response (which settles the stream)
    # without closing the test's database connection, as a second close() would.
    return b"".join(response.streaming_content)


@pytest.mark.django_db
def test_guarded_view_streams_and_charges(people, llmb_fake_openai) -> None:
    body = guarded_call(people["member"], llmb_fake_openai)
    assert body.decode() == "Hello from the fake. " * 3
    line = UsageRecord.objects.get(kind="charge")
    assert line.cost > 0
    assert line.tenant.external_id == "acme"
    assert llmb_fake_openai.last.body["max_completion_tokens"] == 200


@pytest.mark.django_db
def test_one_identity_for_end_users(people, llmb_fake_openai) -> None:
    """The member's guarded call lands under the end user the pages show them, and that end
    user is not their email address (no personal data in the ledger)."""
    member = people["member"]
    guarded_call(member, llmb_fake_openai)
    line = UsageRecord.objects.select_related("end_user").get(kind="charge")
    assert line.end_user is not None
    assert "@" not in line.end_user.external_id
    call_command("llm_budgets_rollup", stdout=io.StringIO())
    page = client_for(member).get(reverse("llm_budgets_pages:models")).content.decode()
    assert "No usage this billing period yet" not in page


@pytest.mark.django_db
def test_kit_moves_admission_with_time_machine(people, llmb_clock) -> None:
    with time_machine.travel(datetime(2031, 5, 20, 9, tzinfo=UTC), tick=False):
        hold = budgets.reserve(tenant="acme", model="gpt-4o", input_tokens=10, max_output_tokens=10)
    assert (hold.expires_at.year, hold.expires_at.month) == (2031, 5)
    budgets.release(hold.id)
