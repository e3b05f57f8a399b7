"""REST API keys: created through ``api_key_create`` (the key is shown once, only its hash is
kept) and revoked through ``api_key_revoke`` (audited; a revoked key stays for the record)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from llm_budgets.admin.base import AppAdmin, actor, adopt, when_column
from llm_budgets.control.api_keys import api_key_create, api_key_revoke, api_key_self_serve_check
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import ApiKey


def _fold_in_third_party_admin() -> None:
    """One "API keys" entry: djangorestframework-api-key registers an admin for its own
    ``APIKey`` model, which this app never uses (its keys are ``ApiKey``). Registered or not yet
    (apps load in settings order), the import makes it registered, then it is removed. Without
    the app there is nothing to fold in (its admin imports its models, which Django would refuse
    to load), and check ``llm_budgets.E092`` names it."""
    if not apps.is_installed("rest_framework_api_key"):
        return
    try:
        from rest_framework_api_key import admin as _third_party  # noqa: F401
        from rest_framework_api_key.models import APIKey
    except ImportError:  # pragma: no cover - the app requires the package
        return
    if admin.site.is_registered(APIKey):
        admin.site.unregister(APIKey)


_fold_in_third_party_admin()


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["name", "tenant", "expiry_date", "self_serve"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("self_serve") and data.get("tenant") is None and "tenant" not in self.errors:
            # api_key_create's own refusal, shown beside the field before anything is written.
            try:
                api_key_self_serve_check(tenant=None, self_serve=True)
            except InvalidUsage as exc:
                self.add_error("self_serve", exc.message)
        return data

    def clean_expiry_date(self) -> datetime | None:
        expiry: datetime | None = self.cleaned_data.get("expiry_date")
        if expiry is not None and expiry <= timezone.now():
            raise forms.ValidationError("The expiry must be in the future.")
        return expiry


@admin.register(ApiKey)
class ApiKeyAdmin(AppAdmin):
    """A key without a tenant is an operator key: it acts for every tenant and may set limits."""

    form = ApiKeyForm
    list_display = [
        "prefix",
        "name",
        "scope",
        "self_serve",
        "created_when",
        "expiry_when",
        "revoked",
    ]
    list_filter = ["revoked", "self_serve", ("tenant", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "tenant__external_id"]
    list_select_related = ["tenant"]
    autocomplete_fields = ["tenant"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # Scope and expiry are fixed at creation: a key that needs another scope is a new key.
        if obj is None:
            return []
        return ["prefix", "name", "tenant", "self_serve", "expiry_when", "revoked", "created_when"]

    created_when = when_column("created", "Created")
    expiry_when = when_column("expiry_date", "Expires")

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        if obj is None:
            return ["name", "tenant", "expiry_date", "self_serve"]
        return ["prefix", "name", "tenant", "self_serve", "expiry_when", "revoked", "created_when"]

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # view only; revoke with the action

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # revoke instead, so the audit trail keeps the key's prefix

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        saved, key = api_key_create(
            tenant=obj.tenant.external_id if obj.tenant else None,
            name=obj.name,
            expires_at=obj.expiry_date,
            actor=actor(request),
            self_serve=bool(form.cleaned_data.get("self_serve")),
        )
        adopt(obj, saved)
        messages.warning(
            request,
            f"The API key is: {key} — store it now, it is not shown again. "
            "Send it as 'Authorization: Api-Key <key>'.",
        )

    @admin.display(description="Scope")
    def scope(self, obj: ApiKey) -> str:
        return obj.scope_label

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("llm_budgets.change_apikey")

    @admin.action(description="Revoke selected API keys (cannot be undone)", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for api_key in queryset.filter(revoked=False):
            api_key_revoke(api_key, actor=actor(request), reason="revoked in the admin")
            count += 1
        messages.success(request, f"Revoked {count} API key(s).")
