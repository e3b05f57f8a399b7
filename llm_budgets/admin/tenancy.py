"""Plans, tenants and end users. Tenant and end-user writes go through the tenancy services."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, Model
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from llm_budgets.admin.base import actor, adopt, money_text
from llm_budgets.admin.control import TenantControlMixin, control_context
from llm_budgets.admin.selectors import tenant_overview
from llm_budgets.models import LIVE_STATES, EndUser, Plan, Scope, Tenant
from llm_budgets.selectors import BudgetStatus
from llm_budgets.tenants import end_user_ensure, tenant_ensure


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "default_max_output_tokens",
        "unknown_model_policy",
        "markup_percent",
        "tenant_count",
        "created_at",
    ]
    search_fields = ["name"]
    readonly_fields = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(tenant_total=Count("tenants"))

    @admin.display(description="Tenants", ordering="tenant_total")
    def tenant_count(self, obj: Any) -> int:
        return int(obj.tenant_total)


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = [
            "external_id",
            "name",
            "plan",
            "timezone",
            "billing_day",
            "markup_percent",
            "billing_emails",
        ]

    def clean_plan(self) -> Plan | None:
        plan: Plan | None = self.cleaned_data["plan"]
        if plan is None and self.instance.plan_id is not None:
            # tenant_ensure reads "no plan" as "unchanged"; refuse rather than pretend to clear it.
            raise ValidationError("A tenant's plan cannot be removed here; choose another plan.")
        return plan


@admin.register(Tenant)
class TenantAdmin(TenantControlMixin, admin.ModelAdmin):
    """The tenant page also shows where each budget stands and the holds still open."""

    form = TenantForm
    fields = [
        "external_id",
        "name",
        "plan",
        "timezone",
        "billing_day",
        "billing_emails",
        "markup_percent",
        "created_at",
    ]
    list_display = ["external_id", "name", "plan", "timezone", "billing_day", "created_at"]
    list_filter = ["plan", "timezone"]
    list_select_related = ["plan"]
    search_fields = ["external_id", "name"]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # The host's id is how tenant_ensure finds the tenant: fixed once created.
        return ["external_id", "created_at"] if obj is not None else ["created_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Deleting a tenant would drop its caps with no audit trail; no service does that.
        return False

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        saved = tenant_ensure(
            obj.external_id,
            name=obj.name,
            timezone=obj.timezone,
            billing_day=obj.billing_day,
            plan=obj.plan,
            billing_emails=obj.billing_emails,
            markup_percent=obj.markup_percent,
            actor=actor(request),
        )
        adopt(obj, saved)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Tenant | None = None,
    ) -> HttpResponse:
        if obj is not None and obj.pk is not None:
            if context["adminform"].form.errors:
                obj = Tenant.objects.get(pk=obj.pk)  # the stored tenant, not the rejected edit
            context.update(_overview_context(obj))
            context.update(control_context(request, obj, timezone.now()))
        return super().render_change_form(request, context, add, change, form_url, obj)


# Widest first, as a request meets them.
_SCOPE_ORDER: dict[str, int] = {
    Scope.GLOBAL: 0,
    Scope.TENANT: 1,
    Scope.END_USER_DEFAULT: 2,
    Scope.END_USER: 3,
    Scope.API_KEY_DEFAULT: 4,
    Scope.API_KEY: 5,
    Scope.RUN_DEFAULT: 6,
    Scope.RUN: 7,
    Scope.TAG: 8,
}


def _overview_context(tenant: Tenant) -> dict[str, Any]:
    overview = tenant_overview(tenant, timezone.now())
    by_tenant: dict[str, str | int] = {"tenant__id__exact": tenant.pk}
    return {
        "overview_timezone": tenant.timezone,
        "budget_rows": [
            _budget_row(s) for s in sorted(overview.budgets, key=lambda s: _SCOPE_ORDER[s.scope])
        ],
        "end_user_budget_rows": [_budget_row(s) for s in overview.end_user_budgets],
        "end_user_budget_count": overview.end_user_budget_count,
        "scoped_budget_rows": [_budget_row(s) for s in overview.scoped_budgets],
        "end_user_budgets_url": _changelist(
            "budget", {**by_tenant, "scope__exact": Scope.END_USER}
        ),
        "reservation_rows": [
            {
                "id": r.pk,
                "url": reverse("admin:llm_budgets_reservation_change", args=[r.pk]),
                "end_user": r.end_user.external_id if r.end_user else "-",
                "model": f"{r.provider}/{r.model}",
                "amount": money_text(r.amount, r.currency),
                "created_at": r.created_at,
                "expires_at": r.expires_at,
                "overdue": r.expires_at <= timezone.now(),
            }
            for r in overview.open_reservations
        ],
        "open_reservation_count": overview.open_reservation_count,
        "open_reservations_url": _changelist(
            "reservation", {**by_tenant, "state__in": ",".join(LIVE_STATES)}
        ),
        "tenant_links": [
            ("End users", _changelist("enduser", by_tenant)),
            ("Budgets", _changelist("budget", by_tenant)),
            ("Reservations", _changelist("reservation", by_tenant)),
            ("Usage (ledger)", _changelist("usagerecord", by_tenant)),
            ("Audit log", _changelist("auditevent", by_tenant)),
        ],
    }


def _budget_row(status: BudgetStatus) -> dict[str, Any]:
    used = status.spent + status.reserved
    return {
        "url": reverse("admin:llm_budgets_budget_change", args=[status.budget_id]),
        "scope": status.scope_label,
        "window": status.window,
        "limit": money_text(status.limit, status.currency),
        "spent": money_text(status.spent, status.currency),
        "reserved": money_text(status.reserved, status.currency),
        "remaining": money_text(status.remaining, status.currency),
        "used_percent": min(100, int(used * 100 / status.limit)) if status.limit else 100,
        "exhausted": status.remaining == 0,
        "period_start": status.period_start,
        "resets_at": status.resets_at,
    }


def _changelist(model_name: str, params: Mapping[str, str | int]) -> str:
    return f"{reverse(f'admin:llm_budgets_{model_name}_changelist')}?{urlencode(params)}"


@admin.register(EndUser)
class EndUserAdmin(admin.ModelAdmin):
    """End users are created by end_user_ensure (here or on first request); never edited."""

    list_display = ["external_id", "tenant", "created_at"]
    list_select_related = ["tenant"]
    search_fields = ["external_id", "tenant__external_id"]
    date_hierarchy = "created_at"
    autocomplete_fields = ["tenant"]
    fields = ["tenant", "external_id", "created_at"]
    readonly_fields = ["created_at"]

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Its external id is the host's key: renaming or moving it would split its history.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: EndUser, form: Any, change: bool) -> None:
        saved = end_user_ensure(obj.tenant, obj.external_id)
        adopt(obj, saved)
