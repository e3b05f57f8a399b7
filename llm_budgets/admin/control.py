"""Support actions: kill switches, temporary raises, refusals, and the tenant page's actions
(reset an end user's period spend, void a ledger line). Every write calls a service, which
audits it; every action checks its permission (see :mod:`llm_budgets.roles`) and answers 403
to a person without it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from llm_budgets.adjustments import end_user_spend_reset, usage_void
from llm_budgets.admin.base import ReadOnlyAdmin, actor, adopt, money_text
from llm_budgets.budget_raises import budget_raise_grant
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.killswitches import (
    SwitchScope,
    kill_switch_clear,
    kill_switch_trip,
    switch_is_open,
    switch_open_q,
)
from llm_budgets.models import (
    BudgetRaise,
    EndUser,
    KillSwitch,
    Refusal,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.tenants import end_user_ensure

RECENT_ROWS = 20

_REASON = forms.CharField(
    widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
    help_text="Required. Kept in the audit log and shown to whoever is refused.",
)


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(f"llm_budgets.{permission}"):
        raise PermissionDenied


class TripForm(forms.ModelForm):
    end_user_id = forms.CharField(
        required=False, label="End user", help_text="External id; needs the tenant."
    )
    reason = _REASON

    class Meta:
        model = KillSwitch
        fields = ["tenant", "provider", "model", "auto_clear_at", "reason"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("end_user_id") and not data.get("tenant"):
            raise forms.ValidationError("An end user needs its tenant.")
        auto_clear_at = data.get("auto_clear_at")
        if auto_clear_at is not None and auto_clear_at <= timezone.now():
            self.add_error("auto_clear_at", "Must be in the future (or empty: a person clears).")
        return data


class ClearForm(forms.ModelForm):
    clear_reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        label="Reason to clear",
        help_text="Required. Saving clears the switch; admission reopens at once.",
    )

    class Meta:
        model = KillSwitch
        fields = ["clear_reason"]


@admin.register(KillSwitch)
class KillSwitchAdmin(admin.ModelAdmin):
    """Adding trips a switch; saving an open one with a reason clears it. Support's tool."""

    list_display = ["scope", "reason", "tripped_by", "tripped_at", "automatic", "state"]
    list_filter = ["automatic", "detector", ("cleared_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant", "end_user__tenant", "api_key"]
    search_fields = ["tenant__external_id", "end_user__external_id", "model", "reason"]
    date_hierarchy = "tripped_at"
    autocomplete_fields = ["tenant"]
    shown = (
        "scope",
        "reason",
        "tripped_by",
        "tripped_at",
        "automatic",
        "detector",
        "auto_clear_at",
        "cleared_at",
        "cleared_by",
        "clear_reason",
    )

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        kwargs["form"] = TripForm if obj is None else ClearForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return ["tenant", "end_user_id", "provider", "model", "auto_clear_at", "reason"]
        if isinstance(obj, KillSwitch) and obj.cleared_at is None:
            return [*self.shown[:7], "clear_reason"]
        return list(self.shown)

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        if obj is None:
            return []
        if isinstance(obj, KillSwitch) and obj.cleared_at is None:
            return list(self.shown[:7])
        return list(self.shown)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        if isinstance(obj, KillSwitch) and obj.cleared_at is not None:
            return False  # history
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: KillSwitch, form: Any, change: bool) -> None:
        # The forms validated everything the services check, so these do not raise here.
        data = form.cleaned_data
        if change:
            saved = kill_switch_clear(
                switch_id=obj.pk, reason=data["clear_reason"], actor=actor(request)
            )
        else:
            tenant = data.get("tenant")
            end_user = None
            if data.get("end_user_id") and tenant is not None:
                end_user = end_user_ensure(tenant, data["end_user_id"])
            saved = kill_switch_trip(
                scope=SwitchScope(
                    tenant=tenant,
                    end_user=end_user,
                    provider=data.get("provider") or "",
                    model=data.get("model") or "",
                ),
                reason=data["reason"],
                actor=actor(request),
                auto_clear_at=data.get("auto_clear_at"),
            )
        adopt(obj, saved)

    @admin.display(description="Scope")
    def scope(self, obj: KillSwitch) -> str:
        return obj.scope_label

    @admin.display(description="State")
    def state(self, obj: KillSwitch) -> str:
        if obj.cleared_at is not None:
            return f"cleared {obj.cleared_at:%Y-%m-%d %H:%M} by {obj.cleared_by or '?'}"
        if not switch_is_open(obj, timezone.now()):
            return "expired"
        return "TRIPPED"


class RaiseForm(forms.ModelForm):
    until = forms.DateTimeField(help_text="The raise ends by itself at this time.")
    reason = _REASON

    class Meta:
        model = BudgetRaise
        fields = ["budget", "amount", "until", "reason"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("amount") is not None and data["amount"] <= 0:
            self.add_error("amount", "Must be more than zero.")
        if data.get("until") is not None and data["until"] <= timezone.now():
            self.add_error("until", "Must be in the future.")
        return data


@admin.register(BudgetRaise)
class BudgetRaiseAdmin(admin.ModelAdmin):
    """Adding grants a temporary raise (billing admins); raises are never edited or deleted."""

    form = RaiseForm
    list_display = ["budget", "amount_text", "starts_at", "ends_at", "granted_by", "active"]
    list_select_related = ["budget__tenant", "budget__end_user__tenant"]
    search_fields = ["budget__tenant__external_id", "reason", "granted_by"]
    autocomplete_fields = ["budget"]
    date_hierarchy = "starts_at"

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return ["budget", "amount", "until", "reason"]
        return ["budget", "amount", "starts_at", "ends_at", "reason", "granted_by", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [] if obj is None else self.get_fields(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: BudgetRaise, form: Any, change: bool) -> None:
        data = form.cleaned_data
        saved = budget_raise_grant(
            budget=data["budget"],
            amount=data["amount"],
            until=data["until"],
            reason=data["reason"],
            actor=actor(request),
        )
        adopt(obj, saved)

    @admin.display(description="Amount", ordering="amount")
    def amount_text(self, obj: BudgetRaise) -> str:
        return money_text(obj.amount, obj.budget.currency)

    @admin.display(description="Active now", boolean=True)
    def active(self, obj: BudgetRaise) -> bool:
        return obj.starts_at <= timezone.now() < obj.ends_at


@admin.register(Refusal)
class RefusalAdmin(ReadOnlyAdmin):
    """Why was I blocked? One row per refused admission."""

    list_display = ["created_at", "tenant", "end_user", "model", "kind", "detail", "requested_text"]
    list_filter = ["kind"]
    list_select_related = ["tenant", "end_user__tenant"]
    search_fields = ["tenant__external_id", "end_user__external_id", "model", "detail"]
    date_hierarchy = "created_at"

    @admin.display(description="Requested / remaining")
    def requested_text(self, obj: Refusal) -> str:
        currency = obj.budget.currency if obj.budget_id and obj.budget else ""
        requested = money_text(obj.requested, currency).strip()
        if obj.remaining is None:
            return requested
        return f"{requested} / {money_text(obj.remaining, currency).strip()}"


class ResetForm(forms.Form):
    end_user = forms.CharField(help_text="The end user's external id.")
    reason = _REASON


class VoidForm(forms.Form):
    reason = _REASON


class TenantControlMixin:
    """Tenant-page actions (reset, void) and the control part of the page's context."""

    admin_site: admin.AdminSite

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:tenant_id>/reset-end-user/",
                wrap(self.reset_end_user_view),
                name="llm_budgets_tenant_reset_end_user",
            ),
            path(
                "<int:tenant_id>/void/<int:line_id>/",
                wrap(self.void_line_view),
                name="llm_budgets_tenant_void_line",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def reset_end_user_view(self, request: HttpRequest, tenant_id: int) -> HttpResponse:
        _require(request, "reset_spend")
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        form = ResetForm(request.POST or None, initial=request.GET)
        if request.method == "POST" and form.is_valid():
            end_user = EndUser.objects.filter(
                tenant=tenant, external_id=form.cleaned_data["end_user"]
            ).first()
            if end_user is None:
                form.add_error("end_user", "This tenant has no such end user.")
            else:
                lines = end_user_spend_reset(
                    end_user=end_user, reason=form.cleaned_data["reason"], actor=actor(request)
                )
                messages.success(
                    request,
                    f"Reset {end_user}: {len(lines)} compensating ledger line(s) written.",
                )
                return _back_to(tenant)
        return _form_page(
            request,
            title=f"Reset an end user's period spend ({tenant.external_id})",
            form=form,
            explanation=(
                "Brings the end user's own budgets back to zero spent for the current period "
                "with compensating ledger lines (nothing is deleted). The tenant's and global "
                "budgets keep the spend: that money was spent."
            ),
            tenant=tenant,
        )

    def void_line_view(self, request: HttpRequest, tenant_id: int, line_id: int) -> HttpResponse:
        _require(request, "void_usagerecord")
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        line = get_object_or_404(UsageRecord, pk=line_id, tenant=tenant)
        form = VoidForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                usage_void(
                    record_id=line.pk, reason=form.cleaned_data["reason"], actor=actor(request)
                )
            except InvalidUsage as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Voided ledger line {line.pk}.")
                return _back_to(tenant)
        return _form_page(
            request,
            title=f"Void ledger line {line.pk} ({tenant.external_id})",
            form=form,
            explanation=(
                f"{line.kind} of {money_text(line.cost, line.currency)} for "
                f"{line.provider}/{line.model} at {line.created_at:%Y-%m-%d %H:%M} UTC. Voiding "
                "adds a compensating line of the opposite cost; the line itself stays."
            ),
            tenant=tenant,
        )


def _back_to(tenant: Tenant) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]))


def _form_page(
    request: HttpRequest, *, title: str, form: forms.Form, explanation: str, tenant: Tenant
) -> TemplateResponse:
    return TemplateResponse(
        request,
        "admin/llm_budgets/control/action_form.html",
        {
            **admin.site.each_context(request),
            "title": title,
            "form": form,
            "explanation": explanation,
            "back_url": reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]),
        },
    )


def control_context(request: HttpRequest, tenant: Tenant, now: datetime) -> dict[str, Any]:
    """The tenant page's control sections: open switches, recent refusals, recent ledger lines
    (with void links for billing admins) and the action links the user may use."""
    user = request.user
    # Only switches refusing calls now: one past its auto_clear_at no longer does.
    switches = KillSwitch.objects.filter(switch_open_q(now), tenant=tenant).select_related(
        "tenant", "end_user__tenant"
    )
    refusals = Refusal.objects.filter(tenant=tenant).select_related("end_user", "budget")[
        :RECENT_ROWS
    ]
    lines = UsageRecord.objects.filter(tenant=tenant).select_related("end_user", "voids")[
        :RECENT_ROWS
    ]
    can_void = user.has_perm("llm_budgets.void_usagerecord")
    actions = []
    if user.has_perm("llm_budgets.add_killswitch"):
        actions.append(
            (
                "Trip a kill switch",
                f"{reverse('admin:llm_budgets_killswitch_add')}?tenant={tenant.pk}",
            )
        )
    if user.has_perm("llm_budgets.add_budgetraise"):
        actions.append(("Grant a temporary raise", reverse("admin:llm_budgets_budgetraise_add")))
    if user.has_perm("llm_budgets.reset_spend"):
        actions.append(
            (
                "Reset an end user's period spend",
                reverse("admin:llm_budgets_tenant_reset_end_user", args=[tenant.pk]),
            )
        )
    return {
        "control_actions": actions,
        "switch_rows": [
            {
                "scope": s.scope_label,
                "reason": s.reason,
                "who": s.tripped_by or (f"detector {s.detector}" if s.automatic else "-"),
                "when": s.tripped_at,
                "url": reverse("admin:llm_budgets_killswitch_change", args=[s.pk]),
            }
            for s in switches
        ],
        "refusal_rows": [
            {
                "when": r.created_at,
                "end_user": r.end_user.external_id if r.end_user else "-",
                "model": r.model,
                "why": r.detail,
                "requested": money_text(r.requested, "") if r.requested is not None else "-",
                "remaining": money_text(r.remaining, "") if r.remaining is not None else "-",
            }
            for r in refusals
        ],
        "refusals_url": (
            f"{reverse('admin:llm_budgets_refusal_changelist')}?tenant__id__exact={tenant.pk}"
        ),
        "line_rows": [
            {
                "id": line.pk,
                "when": line.created_at,
                "end_user": line.end_user.external_id if line.end_user else "-",
                "kind": line.kind,
                "call": f"{line.provider}/{line.model}" if line.model else "-",
                "cost": money_text(line.cost, line.currency),
                "void_url": reverse("admin:llm_budgets_tenant_void_line", args=[tenant.pk, line.pk])
                if can_void and line.kind != UsageKind.ADJUSTMENT
                else None,
            }
            for line in lines
        ],
    }
