"""A host's user model as llm_budgets sees it (issue 23): no ``username`` assumed.

The test settings cannot swap ``AUTH_USER_MODEL`` per test, so the derivation is tested with model
classes here; the host matrix runs an email-login host end to end.
"""

from __future__ import annotations

import csv
import io
from typing import Any
from unittest import mock

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import models
from django.test import Client, RequestFactory
from django.test.utils import isolate_apps, override_settings
from django.urls import reverse

from llm_budgets.admin.memberships import MembershipAdmin
from llm_budgets.checks import check_settings
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.host_users import end_user_id, user_lookup_fields
from llm_budgets.integrations.django import request_end_user
from llm_budgets.models import EndUser, Membership, MembershipRole, Tenant
from tests.factories import reserve_30, seed


@isolate_apps("llm_budgets")
def test_an_email_login_model_is_searched_by_its_own_fields() -> None:
    class EmailUser(AbstractBaseUser):  # cookiecutter-django's shape: no username at all
        email = models.EmailField(unique=True)
        name = models.CharField(max_length=255, blank=True)
        USERNAME_FIELD = "email"
        EMAIL_FIELD = "email"

        class Meta:
            app_label = "llm_budgets"

    class HandleUser(AbstractBaseUser):  # a login handle, no email field (EMAIL_FIELD inherited)
        handle = models.CharField(max_length=40, unique=True)
        USERNAME_FIELD = "handle"

        class Meta:
            app_label = "llm_budgets"

    assert user_lookup_fields(EmailUser) == ["email"]
    assert user_lookup_fields(HandleUser) == ["handle"]
    for user_model in (EmailUser, HandleUser):
        with mock.patch(
            "llm_budgets.admin.memberships.get_user_model", return_value=user_model, create=True
        ):
            fields = MembershipAdmin(Membership, admin.site).get_search_fields(
                RequestFactory().get("/")
            )
        user_fields = [f.removeprefix("user__") for f in fields if f.startswith("user__")]
        assert user_fields, fields
        for name in user_fields:  # a missing field is the changelist's 500 (FieldError)
            user_model._meta.get_field(name)


@pytest.mark.django_db
def test_the_membership_changelist_finds_a_member_by_email() -> None:
    seed()
    user_model = get_user_model()
    member = user_model.objects.create_user(username="m1", email="ada@example.com", password=None)
    Membership.objects.create(
        user=member, tenant=Tenant.objects.get(external_id="acme"), role=MembershipRole.MEMBER
    )
    superuser = user_model.objects.create_user(
        username="root", password=None, is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(superuser)
    url = reverse("admin:llm_budgets_membership_changelist")
    response = client.get(url, {"q": "ada@example"})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1


def _member(email: str, **membership: object) -> Any:
    """An email-login member of acme: the username is the email, as on such hosts."""
    user = get_user_model().objects.create_user(username=email, email=email, password=None)
    Membership.objects.create(
        user=user,
        tenant=Tenant.objects.get(external_id="acme"),
        role=MembershipRole.MEMBER,
        **membership,
    )
    return user


def _export_rows(user: Any) -> list[list[str]]:
    client = Client()
    client.force_login(user)
    response = client.get("/usage/export.csv")
    assert response.status_code == 200
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.mark.django_db
def test_a_call_recorded_by_the_django_helper_is_on_its_members_pages() -> None:
    """One rule: what ``request_end_user`` records under is what the pages show a member, and by
    default it is the primary key, not the email (no personal data in the ledger)."""
    seed()
    member = _member("ada@example.com")
    request = RequestFactory().get("/chat/")
    request.user = member
    end_user = request_end_user(request)
    assert end_user == str(member.pk)
    reserve_30(end_user=end_user).commit(input_tokens=0, output_tokens=100)

    rows = _export_rows(member)
    assert len(rows) == 2, rows  # the header and the member's call
    assert "ada@example.com" not in repr(rows)
    assert not EndUser.objects.filter(external_id="ada@example.com").exists()


@pytest.mark.django_db
def test_end_user_id_follows_the_setting_and_refuses_an_unusable_id() -> None:
    seed()
    member = _member("ada@example.com")
    request = RequestFactory().get("/chat/")
    request.user = member
    with override_settings(LLM_BUDGETS={"END_USER_ID": "llm_budgets.host_users.user_username"}):
        assert request_end_user(request) == "ada@example.com"
        assert Membership.objects.get(user=member).end_user_key == "ada@example.com"
    blank = override_settings(LLM_BUDGETS={"END_USER_ID": "tests.test_host_users.blank_id"})
    with blank, pytest.raises(InvalidUsage, match=r"END_USER_ID.*test_host_users\.blank_id"):
        end_user_id(member)
    # A membership's own end user overrides the rule.
    Membership.objects.filter(user=member).update(end_user_external_id="ada-1")
    assert Membership.objects.get(user=member).end_user_key == "ada-1"
    request.user = AnonymousUser()
    assert request_end_user(request) is None


def blank_id(user: Any) -> str:
    return " "


def test_a_bad_end_user_id_path_is_a_system_check_error() -> None:
    with override_settings(LLM_BUDGETS={"END_USER_ID": "myproject.nowhere.end_user"}):
        errors = [e for e in check_settings() if e.id == "llm_budgets.E065"]
    assert len(errors) == 1
    assert "END_USER_ID" in errors[0].msg
