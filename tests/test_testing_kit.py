"""llm_budgets.testing, the kit for hosts' own tests: it imports no pytest, sets up in one call,
and moves admission's clock with time_machine only when asked."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine

from llm_budgets import budgets
from llm_budgets.models import Budget, Price, Tenant
from llm_budgets.testing import PRICES, application_clock, setup_budgets

# The kit's pytest fixtures, as a host's conftest gets them with
# pytest_plugins = ["llm_budgets.testing.pytest"] (here imported into this module).
from llm_budgets.testing.pytest import llmb_fake_anthropic as llmb_fake_anthropic
from llm_budgets.testing.pytest import llmb_fake_openai as llmb_fake_openai
from llm_budgets.testing.pytest import llmb_fake_stripe as llmb_fake_stripe


def test_the_app_never_imports_the_kit_and_the_kit_imports_no_pytest() -> None:
    code = (
        "import sys, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'project.settings'; "
        "import django; django.setup(); import llm_budgets.budgets, llm_budgets.api.urls; "
        "from django.core.management import call_command; call_command('check', verbosity=0); "
        "leaked = sorted(m for m in sys.modules if m.startswith('llm_budgets.testing')); "
        "assert not leaked, leaked; "
        "import llm_budgets.testing, llm_budgets.testing.fakes; "
        "assert 'pytest' not in sys.modules, 'the kit imported pytest'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.django_db
def test_setup_budgets_prices_tenants_and_limits_in_one_call() -> None:
    seeded = setup_budgets(["acme", "globex"], limit="50", each_user_limit="5", name="Same")
    assert [t.external_id for t in seeded.tenants] == ["acme", "globex"]
    assert Tenant.objects.get(external_id="globex").name == "Same"
    assert Price.objects.count() == len(PRICES)
    tenant_caps = Budget.objects.filter(tenant__external_id="acme", scope="tenant")
    assert [b.limit for b in tenant_caps] == [Decimal("50")]
    assert Budget.objects.filter(scope="end_user_default").count() == 2
    # Called again (another test's setup, a fixture reused): limits change, nothing fails.
    setup_budgets("acme", limit="70")
    assert Budget.objects.get(tenant__external_id="acme", scope="tenant").limit == Decimal(70)
    hold = budgets.reserve(
        tenant="acme", end_user="u-1", model="gpt-4o", input_tokens=1000, max_output_tokens=1000
    )
    # (1000 + its input tolerance, 356) x 2.50 + 1000 x 10.00 per million tokens.
    assert hold.amount == Decimal("0.01339")
    budgets.release(hold.id)


@pytest.mark.django_db(transaction=True)
def test_application_clock_lets_time_machine_move_admission() -> None:
    setup_budgets("acme", limit="100")
    with time_machine.travel(datetime(2031, 3, 15, 12, tzinfo=UTC), tick=False):
        moved = budgets.reserve(tenant="acme", model="gpt-4o", input_tokens=1, max_output_tokens=1)
        with application_clock():
            followed = budgets.reserve(
                tenant="acme", model="gpt-4o", input_tokens=1, max_output_tokens=1
            )
    # Without the kit admission read the database's clock, which time_machine cannot move.
    assert moved.expires_at.year != 2031
    assert (followed.expires_at.year, followed.expires_at.month) == (2031, 3)
    for hold in (moved, followed):
        budgets.release(hold.id)


def test_fake_stripe_fixture_points_the_apps_client_at_it(llmb_fake_stripe) -> None:
    from llm_budgets.billing.client import stripe_client

    customer = llmb_fake_stripe.add_customer(name="Acme")
    assert stripe_client().v1.customers.retrieve(customer).id == customer


def test_fake_provider_fixtures_point_the_sdk_clients_at_them(
    llmb_fake_openai, llmb_fake_anthropic
) -> None:
    import anthropic
    import openai

    reply = openai.OpenAI(max_retries=0).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "Hello from the fake. "
    message = anthropic.Anthropic(max_retries=0).messages.create(
        model="claude-sonnet-4-20250514",
        max_tokens=10,
        messages=[{"role": "user", "content": "hi"}],
    )
    assert message.usage.input_tokens == 30
    assert llmb_fake_openai.last.path == "/v1/chat/completions"
    assert llmb_fake_anthropic.last.path == "/v1/messages"


@pytest.mark.django_db(transaction=True)
def test_round_trips_sees_the_statements_of_the_ledgers_own_connection() -> None:
    """Outside a test's transaction the ledger commits on its own connection (PostgreSQL): the
    reservation's statements are counted all the same."""
    from llm_budgets.db.ledger import ledger_joins_caller
    from llm_budgets.testing.queries import round_trips
    from tests.factories import reserve_30, seed

    if ledger_joins_caller():
        pytest.skip("the ledger has no connection of its own here (SQLite)")
    seed()
    with round_trips() as trips:
        reserve_30(end_user="u1")
    sent = [sql for trip in trips for sql in trip]
    assert any("llm_budgets_reservation" in sql and "INSERT" in sql for sql in sent), sent
