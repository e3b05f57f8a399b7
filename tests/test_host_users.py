"""A host's user model as llm_budgets sees it (issue 23): no ``username`` assumed.

The test settings cannot swap ``AUTH_USER_MODEL`` per test, so the derivation is tested with model
classes here; the host matrix runs an email-login host end to end.
"""

from __future__ import annotations

from unittest import mock

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models
from django.test import Client, RequestFactory
from django.test.utils import isolate_apps
from django.urls import reverse

from llm_budgets.admin.memberships import MembershipAdmin
from llm_budgets.host_users import user_lookup_fields
from llm_budgets.models import Membership, MembershipRole, Tenant
from tests.factories import seed


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
