"""The demonstration (issue 2 F) and the demo data that ``make demo`` loads."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from llm_budgets import budgets
from llm_budgets.models import Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


def _run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def _demo() -> dict[str, Any]:
    return json.loads(_run("llm_budgets_demo", "--json"))  # type: ignore[no-any-return]


def test_demo_counts_the_race_and_the_leak_and_reruns() -> None:
    report = _demo()
    race, failures = report["race"], report["failures"]
    assert (report["limit"], report["worst_case"]) == ("100.00", "30.00")
    # The naive counter let the concurrent calls through past the limit.
    assert Decimal(race["naive"]["spent"]) > Decimal(report["limit"])
    assert race["naive"]["billed"] == race["naive"]["spent"]
    assert race["guarded"] == {
        "admitted": 3,
        "refused": 7,
        "reserved": "90.00",
        "billed": "90.00",
        "spent": "90.00",
        "remaining": "10.00",
    }
    # Charged up front and never refunded, versus released by the with-block.
    assert failures["naive"]["spent"] == "120.00"
    assert failures["naive"]["billed"] == "0.00"
    assert failures["guarded"]["admitted"] == 4
    assert failures["guarded"]["spent"] == "0.00"
    assert failures["guarded"]["remaining"] == "100.00"
    assert report["problems"] == []
    assert "remaining of 100.00" in report["refusal_example"]

    # Again on the same database, as text: its own fresh run budgets on the same two tenants
    # (no tenant left behind per run), the same counted outcome.
    text = _run("llm_budgets_demo")
    assert "naive counter     llm_budgets" in text
    assert re.search(r"admitted / refused +\d+ / \d+ +3 / 7\n", text)
    assert "once 90.00 was held the other 7 calls were refused" in text
    assert "Budget exceeded" in text
    assert report["runs"][0] not in text
    assert Tenant.objects.filter(external_id__startswith="demo-").count() == 2


def test_demo_exits_non_zero_when_llm_budgets_admits_past_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Simulate a broken ledger: it enforces ten times the limit the demo expects.
    set_limit = budgets.set_limit

    def tenfold(**kwargs: Any) -> Any:
        return set_limit(**{**kwargs, "amount": kwargs["amount"] * 10})

    monkeypatch.setattr(budgets, "set_limit", tenfold)
    with pytest.raises(CommandError, match=r"llm_budgets held 300\.00 at once"):
        _run("llm_budgets_demo")


def test_demo_exits_non_zero_when_a_failed_call_keeps_its_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(budgets.Hold, "release", lambda self: self.state)
    with pytest.raises(CommandError, match=r"Failed calls left spent 0\.00 and reserved 90\.00"):
        _run("llm_budgets_demo")


def test_demo_data_is_idempotent_and_resets_the_admin_password() -> None:
    first = json.loads(_run("llm_budgets_demo_data", "--json"))
    assert first["created"]["llm_budgets.Tenant"] == 3
    assert first["created"]["llm_budgets.Price"] == 4
    assert first["created"]["llm_budgets.Budget"] == 8
    # The eight reservations of the admin tour, and the month of usage for the tenant pages.
    assert first["month"]["committed"] > 300
    assert first["created"]["llm_budgets.Reservation"] == 8 + first["month"]["committed"]
    assert first["page_users"] == ["acme-admin", "globex-admin", "alice"]
    assert first["created"]["auth.User"] == 4  # the admin and the usage pages' three logins
    assert first["reservations"] == {"committed": 4, "released": 2, "held": 2}

    text = _run("llm_budgets_demo_data")
    assert "added now     nothing, all present" in text
    assert "reservations  4 committed, 2 held, 2 released" in text
    login = re.search(r"Admin: (\S+) +user 'admin' +password '([^']+)'", text)
    assert login is not None, text
    assert login[1] == "http://127.0.0.1:8000/admin/"
    assert "Usage pages: http://127.0.0.1:8000/usage/  users 'acme-admin'" in text
    acme_admin = get_user_model().objects.get(username="acme-admin")
    assert acme_admin.check_password(login[2])
    assert not acme_admin.is_staff
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser
    assert admin.is_staff
    assert admin.check_password(login[2])
    assert not admin.check_password(first["admin_password"])

    # The data went through the ledger: alice has a committed call and an open hold this month,
    # under her own budget.
    own = next(s for s in budgets.status(tenant="acme", end_user="alice") if s.scope == "end_user")
    assert (own.window, own.limit) == ("month", Decimal("10"))
    assert own.spent > 0
    assert own.reserved > 0

    # The month of usage fills every tenant page for the demo's tenant admin.
    from django.test import Client

    pages = Client()
    pages.force_login(acme_admin)
    overview = pages.get("/usage/").content.decode()
    assert 'data-figure="spent"' in overview
    # Today is the only day of the current period on the billing day itself: at least one call.
    models = pages.get("/usage/models/").content.decode()
    assert "(openai)" in models or "(anthropic)" in models
    users = pages.get("/usage/users/").content.decode()
    assert any(name in users for name in ("alice", "bob", "carol", "dave", "erin"))
    refusals = pages.get("/usage/refusals/").content.decode()
    assert refusals.count("needed up to") >= 3
    export = b"".join(pages.get("/usage/export.csv", {"start": "2000-01-01"}).streaming_content)
    assert export.count(b"\n") > 300


@pytest.mark.django_db
def test_the_prepaid_demo_tops_up_once_and_spends_down_to_a_refusal_and_reruns() -> None:
    from demo.prepaid_demo import prepaid_demo_render, prepaid_demo_run

    for _ in range(2):
        report = prepaid_demo_run()
        assert (report.credited, report.grants, report.calls) == (Decimal(100), 1, 3)
        assert "Top up the balance at http://127.0.0.1:8000/usage/balance/" in report.refusal
    assert "credited once: 100.00 USD" in prepaid_demo_render(report)
