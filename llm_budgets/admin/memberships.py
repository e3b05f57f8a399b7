"""Memberships: which host users see which tenant's usage pages, and with what role."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.http import HttpRequest

from llm_budgets.admin.base import AppAdmin, when_column
from llm_budgets.host_users import user_lookup_fields
from llm_budgets.models import Membership


def membership_search_fields(user_model: type) -> list[str]:
    """Search by the user's identifying fields (whatever the host's user model calls them), the
    tenant and the end user: a fixed ``user__username`` is a 500 on an email-login model."""
    users = [f"user__{name}" for name in user_lookup_fields(user_model)]
    return [*users, "tenant__external_id", "end_user_external_id"]


@admin.register(Membership)
class MembershipAdmin(AppAdmin):
    list_display = ["user", "tenant", "role", "end_user_external_id", "created_when"]
    list_filter = ["role"]
    raw_id_fields = ["user", "tenant"]
    readonly_fields = ["created_when"]
    list_select_related = ["user", "tenant"]

    created_when = when_column("created_at", "Created at")

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        return membership_search_fields(get_user_model())
