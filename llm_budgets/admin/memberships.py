"""Memberships: which host users see which tenant's usage pages, and with what role."""

from __future__ import annotations

from django.contrib import admin

from llm_budgets.models import Membership


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "end_user_external_id", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "tenant__external_id", "end_user_external_id"]
    raw_id_fields = ["user", "tenant"]
    readonly_fields = ["created_at"]
    list_select_related = ["user", "tenant"]
