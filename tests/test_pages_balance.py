"""The tenant pages' balance (issue 30): figures and history for the tenant's admins, a "Top up"
form that only they may use, nothing for members or other tenants."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from llm_budgets import budgets
from llm_budgets.billing.credits import account_of, balance_open, credit_add
from llm_budgets.models import Counter, TopUp
from llm_budgets.testing.fakes.stripe_server import StripeServer
from llm_budgets.windows import LIFETIME_START
from tests.pages import People, people, usage_data
from tests.stripe_support import stripe_settings

pytestmark = pytest.mark.django_db

PAGE, FORM = "/usage/balance/", "/usage/balance/top-up"


@pytest.fixture
def folks(settings: Any) -> Any:
    with StripeServer() as fake:
        settings.LLM_BUDGETS = stripe_settings(fake.base_url)
        usage_data()
        budgets.link_stripe_customer(tenant="acme", customer_id=fake.add_customer())
        balance_open(tenant="acme")
        credit_add(account=account_of("acme"), amount="40", actor="t", reason="trial")
        yield people(), fake


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_sees_the_balance_and_tops_up_through_checkout(folks: Any) -> None:
    who, fake = folks
    page = client_for(who.acme_admin).get(PAGE)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-available="40' in text
    assert "Grant by staff" in text
    assert 'name="amount"' in text
    answer = client_for(who.acme_admin).post(FORM, {"amount": "15"})
    assert answer.status_code == 302
    top_up = TopUp.objects.get()
    assert answer["Location"] == fake.state.checkout_sessions[top_up.checkout_session_id]["url"]
    assert top_up.amount == 15


def test_a_bad_amount_is_shown_on_the_page(folks: Any) -> None:
    who, _ = folks
    answer = client_for(who.acme_admin).post(FORM, {"amount": "-3"})
    assert answer.status_code == 400
    assert "amount" in answer.content.decode()
    assert not TopUp.objects.exists()


def test_members_support_and_other_tenants_cannot_top_up(folks: Any) -> None:
    who: People = folks[0]
    assert client_for(who.acme_member).get(PAGE).status_code == 403
    assert client_for(who.acme_member).post(FORM, {"amount": "5"}).status_code == 403
    staff = client_for(who.support).get(PAGE + "?tenant=acme")
    assert staff.status_code == 200
    assert 'name="amount"' not in staff.content.decode()
    assert client_for(who.support).post(FORM + "?tenant=acme", {"amount": "5"}).status_code == 403
    beta = client_for(who.beta_admin).get(PAGE).content.decode()
    assert "not prepaid" in beta
    assert "40" not in beta.split("<main", 1)[-1]
    assert not TopUp.objects.exists()


def test_stripe_failing_a_top_up_says_retry_not_a_bad_amount(folks: Any) -> None:
    """Stripe's failure is not the form's: the page says so with a 503 and Retry-After (issue
    #38); before, the page answered 400 as for a bad amount."""
    who, fake = folks
    fake.inject("/v1/checkout/sessions", "500")
    answer = client_for(who.acme_admin).post(FORM, {"amount": "15"})
    assert answer.status_code == 503
    assert answer["Retry-After"] == "10"
    assert "Nothing was charged" in answer.content.decode()
    assert TopUp.objects.get().state == "failed"


def test_a_balance_spent_past_its_credit_shows_what_is_owed(folks: Any) -> None:
    """Issue #38: the page said 0 available and nothing more."""
    who, _ = folks
    account = account_of("acme")
    Counter.objects.update_or_create(  # 55 spent of the 40 credit (a hold on expired credit)
        budget_id=account.budget_id,
        end_user=None,
        run=None,
        api_key=None,
        period_start=LIFETIME_START,
        stripe=0,
        defaults={"spent": Decimal(55)},
    )
    text = client_for(who.acme_admin).get(PAGE).content.decode()
    assert 'data-available="0' in text
    assert 'data-debt="15' in text
    assert "spent beyond the credit: the next top-up pays it first" in text


def test_no_debt_is_shown_without_one(folks: Any) -> None:
    who, _ = folks
    assert "data-debt" not in client_for(who.acme_admin).get(PAGE).content.decode()
