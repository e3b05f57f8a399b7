"""Support actions: kill switches, temporary raises, refusals, and the tenant page's actions
(reset an end user's period spend, void a ledger line). Every write calls a service, which
audits it; every action checks its permission (see :mod:`llm_budgets.roles`) and answers 403
to a person without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from llm_budgets import clock, money
from llm_budgets.admin.base import (
    AppAdmin,
    ReadOnlyAdmin,
    ValuesFilter,
    actor,
    adopt,
    end_user_link,
    end_user_url,
    money_text,
    row_zone,
    tenant_zone,
    truncated,
    when_column,
    when_text,
)
from llm_budgets.admin.budgets import budget_phrase
from llm_budgets.control.killswitches import (
    SwitchScope,
    kill_switch_clear,
    kill_switch_trip,
    switch_is_open,
    switch_open_q,
)
from llm_budgets.control.limits import api_key_of
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine.adjustments import budget_spend_reset, end_user_spend_reset, usage_void
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    Budget,
    BudgetRaise,
    EndUser,
    KillSwitch,
    Refusal,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.reads.overviews import (
    RECENT_LINES,
    EndUserOverview,
    adjustment_notes,
    refusal_bursts,
    refusal_groups,
    voided_ids,
)
from llm_budgets.tenancy.tenants import end_user_ensure
from llm_budgets.windows import budget_period

# Refusals read for the page before identical ones in a burst are folded together.
RECENT_REFUSALS = 200


def _reason(help_text: str) -> forms.CharField:
    return forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}), help_text=f"Required. {help_text}"
    )


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(f"llm_budgets.{permission}"):
        raise PermissionDenied


class LabelledSplitDateTime(widgets.AdminSplitDateTime):
    """The admin's date and time inputs with a ``<label>`` on each (WCAG 1.3.1, 4.1.2)."""

    template_name = "admin/llm_budgets/widgets/split_datetime.html"


def _picker(help_text: str) -> forms.SplitDateTimeField:
    """A date-time field with the admin's calendar and clock pickers."""
    return forms.SplitDateTimeField(
        widget=LabelledSplitDateTime(), help_text=help_text, required=False
    )


def _clock_help(zone: str | None) -> str:
    name = zone or timezone.get_current_timezone_name()
    return f"Date as YYYY-MM-DD, time as HH:MM, in {name} (now {clock.when(timezone.now(), zone)})."


class ActionFormAdmin(AppAdmin):
    """An add form that does one thing: one button saying what it does (no "Save and add
    another"), times entered in the tenant's timezone, and a message naming what happened."""

    change_form_template = "admin/llm_budgets/control/change_form.html"
    submit_label = "Save"
    add_title = ""  # the add page's title: what it does

    def form_zone(self, request: HttpRequest) -> str | None:
        """The timezone the form's times are entered in (the tenant's, when known)."""
        return None

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {
            **(extra_context or {}),
            "show_save_and_add_another": False,
            "show_save_and_continue": False,
            "submit_label": self.submit_label if object_id is None else "",
        }
        if object_id is None and self.add_title:
            context["title"] = self.add_title
        zone = self.form_zone(request) if object_id is None else None
        with timezone.override(clock.zone(zone)):
            response = super().changeform_view(request, object_id, form_url, context)
            if isinstance(response, TemplateResponse):
                # Rendered here, so the pickers' "Now" and the shown times use the same zone.
                response.render()
            return response

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # An action form picks an existing row: no add / change / view / delete icons beside it.
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        widget = getattr(field, "widget", None)
        if isinstance(widget, widgets.RelatedFieldWidgetWrapper):
            widget.can_add_related = widget.can_change_related = False
            widget.can_view_related = widget.can_delete_related = False
        return field


class TripForm(forms.ModelForm):
    end_user_id = forms.CharField(
        required=False,
        label="End user",
        help_text="The end user's external id, to stop only them; needs the tenant.",
    )
    auto_clear_at = _picker("Empty: the switch stays until a person clears it.")
    reason = _reason("Kept in the audit log and shown to whoever is refused.")

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


class ClearForm(forms.Form):
    clear_reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        label="Reason to clear",
        help_text="Required. Kept in the audit log. Admission reopens at once.",
    )


class DetectorFilter(ValuesFilter):
    title = "detector"
    parameter_name = "detector"
    empty_label = "none (tripped by a person)"


@admin.register(KillSwitch)
class KillSwitchAdmin(ActionFormAdmin):
    """Adding trips a switch; an open switch's page has a "Clear this switch" button that asks
    for a reason and confirmation. Support's tool."""

    list_display = ["scope", "short_reason", "tripped_by", "tripped_when", "automatic", "state"]
    list_filter = ["automatic", DetectorFilter, ("cleared_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant", "end_user__tenant", "api_key"]
    search_fields = ["tenant__external_id", "end_user__external_id", "model", "reason"]
    date_hierarchy = "tripped_at"
    autocomplete_fields = ["tenant"]
    submit_label = "Trip the switch"
    add_title = "Trip a kill switch"
    shown = (
        "scope",
        "state",
        "reason",
        "tripped_by",
        "tripped_when",
        "automatic",
        "detector",
        "auto_clear_when",
        "cleared_when",
        "cleared_by",
        "clear_reason",
    )

    tripped_when = when_column("tripped_at", "Tripped at")
    auto_clear_when = when_column("auto_clear_at", "Clears by itself at")
    cleared_when = when_column("cleared_at", "Cleared at")

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        kwargs["form"] = TripForm
        form = super().get_form(request, obj, change, **kwargs)
        if "auto_clear_at" in form.base_fields:
            form.base_fields["auto_clear_at"].help_text = (
                "Empty: the switch stays until a person clears it. "
                + _clock_help(self.form_zone(request))
            )
        return form

    def form_zone(self, request: HttpRequest) -> str | None:
        wanted = request.POST.get("tenant") or request.GET.get("tenant") or ""
        tenant = Tenant.objects.filter(pk=int(wanted)).first() if wanted.isdigit() else None
        return tenant.timezone if tenant else None

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return ["tenant", "end_user_id", "provider", "model", "auto_clear_at", "reason"]
        return list(self.shown)

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [] if obj is None else list(self.shown)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Never edited: the page's "Clear this switch" button is the one change (it needs
        # change_killswitch, see ``clear_view``).
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:switch_id>/clear/",
                self.admin_site.admin_view(self.clear_view),
                name="llm_budgets_killswitch_clear",
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        switch = KillSwitch.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        context = dict(extra_context or {})
        if (
            switch is not None
            and switch.cleared_at is None
            and request.user.has_perm("llm_budgets.change_killswitch")
        ):
            context["clear_url"] = reverse("admin:llm_budgets_killswitch_clear", args=[switch.pk])
        return super().change_view(request, object_id, form_url, context)

    def clear_view(self, request: HttpRequest, switch_id: int) -> HttpResponse:
        _require(request, "change_killswitch")
        switch = get_object_or_404(
            KillSwitch.objects.select_related("tenant", "end_user__tenant", "api_key"),
            pk=switch_id,
        )
        page = reverse("admin:llm_budgets_killswitch_change", args=[switch.pk])
        if switch.cleared_at is not None:
            messages.info(request, f"The {switch.scope_label} switch is already cleared.")
            return HttpResponseRedirect(page)
        form = ClearForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            kill_switch_clear(
                switch_id=switch.pk,
                reason=form.cleaned_data["clear_reason"],
                actor=actor(request),
            )
            messages.success(
                request, f"Kill switch on {switch.scope_label} cleared: admission reopens now."
            )
            return HttpResponseRedirect(_switch_home(switch))
        zone = tenant_zone(switch)
        return _form_page(
            request,
            title=f"Clear the kill switch on {switch.scope_label}",
            form=form,
            explanation=(
                f"Tripped {when_text(switch.tripped_at, zone)} by "
                f"{switch.tripped_by or 'detector ' + switch.detector or '?'}: "
                # A reason typed as a sentence keeps its own full stop ("fix.", not "fix..").
                f"{switch.reason.rstrip('.')}. "
                "Clearing lets requests in this scope through again at once."
            ),
            back_url=page,
            back_label=f"Kill switch on {switch.scope_label}",
            submit_label="Clear this switch",
        )

    def save_model(self, request: HttpRequest, obj: KillSwitch, form: Any, change: bool) -> None:
        # Only the add form saves (the form validated what the service checks).
        data = form.cleaned_data
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

    def response_add(
        self, request: HttpRequest, obj: KillSwitch, post_url_continue: str | None = None
    ) -> HttpResponse:
        until = (
            f" until {when_text(obj.auto_clear_at, tenant_zone(obj))}" if obj.auto_clear_at else ""
        )
        messages.success(request, f"Kill switch on {obj.scope_label} tripped{until}.")
        return HttpResponseRedirect(_switch_home(obj))

    @admin.display(description="Scope")
    def scope(self, obj: KillSwitch) -> str:
        return obj.scope_label

    @admin.display(description="Reason", ordering="reason")
    def short_reason(self, obj: KillSwitch) -> str:
        return truncated(obj.reason)

    @admin.display(description="State")
    def state(self, obj: KillSwitch) -> str:
        if obj.cleared_at is not None:
            return f"cleared by {obj.cleared_by or '?'}"
        # Open by the switch module's own rule (an auto_clear_at that passed has cleared it).
        if switch_is_open(obj, timezone.now()):
            return "TRIPPED"
        return "cleared by itself (auto_clear_at passed)"


def _switch_home(switch: KillSwitch) -> str:
    """Where support came from: the end user's or the tenant's page, else the switch list."""
    if switch.end_user_id is not None:
        return reverse("admin:llm_budgets_enduser_change", args=[switch.end_user_id])
    if switch.tenant_id is not None:
        return reverse("admin:llm_budgets_tenant_change", args=[switch.tenant_id])
    return reverse("admin:llm_budgets_killswitch_changelist")


class RaiseForm(forms.ModelForm):
    until = _picker("The raise ends by itself at this time.")
    reason = _reason("Why the raise; kept in the audit log.")

    class Meta:
        model = BudgetRaise
        fields = ["budget", "amount", "until", "reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "amount" in self.fields:  # absent on the read-only view of a raise
            self.fields["until"].required = True
            amount = self.fields["amount"]
            amount.help_text = "Added to the limit until then, in the budget's currency."

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("amount") is not None and data["amount"] <= 0:
            self.add_error("amount", "Must be more than zero.")
        if data.get("until") is not None and data["until"] <= timezone.now():
            self.add_error("until", "Must be in the future.")
        return data


@admin.register(BudgetRaise)
class BudgetRaiseAdmin(ActionFormAdmin):
    """Adding grants a temporary raise (billing admins); raises are never edited or deleted."""

    form = RaiseForm
    list_display = ["budget", "amount_text", "starts_when", "ends_when", "granted_by", "active"]
    list_select_related = ["budget__tenant", "budget__end_user__tenant"]
    search_fields = ["budget__tenant__external_id", "reason", "granted_by"]
    autocomplete_fields = ["budget"]
    date_hierarchy = "starts_at"
    submit_label = "Grant the raise"
    add_title = "Grant a temporary raise"

    starts_when = when_column("starts_at", "From")
    ends_when = when_column("ends_at", "Until")

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return ["budget", "amount", "until", "reason"]
        return [
            "budget",
            "amount_text",
            "starts_when",
            "ends_when",
            "reason",
            "granted_by",
            "created_when",
        ]

    created_when = when_column("created_at", "Granted at")

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [] if obj is None else self.get_fields(request, obj)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if "until" in form.base_fields:
            form.base_fields["until"].help_text = (
                "The raise ends by itself at this time. " + _clock_help(self.form_zone(request))
            )
        return form

    def form_zone(self, request: HttpRequest) -> str | None:
        budget = self._budget_asked(request)
        return budget.tenant.timezone if budget is not None and budget.tenant else None

    def _budget_asked(self, request: HttpRequest) -> Budget | None:
        wanted = request.POST.get("budget") or request.GET.get("budget") or ""
        if not wanted.isdigit():
            return None
        return Budget.objects.select_related("tenant", "end_user").filter(pk=int(wanted)).first()

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        initial.pop("tenant", None)
        return initial

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # Opened from a tenant's page: only that tenant's budgets to choose from.
        wanted = request.GET.get("tenant", "")
        if db_field.name == "budget" and wanted.isdigit():
            kwargs["queryset"] = Budget.objects.filter(tenant_id=int(wanted)).select_related(
                "tenant", "end_user"
            )
            kwargs["widget"] = forms.Select()
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

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

    def response_add(
        self, request: HttpRequest, obj: BudgetRaise, post_url_continue: str | None = None
    ) -> HttpResponse:
        budget = obj.budget
        messages.success(
            request,
            f"Raise of {money.money(obj.amount, budget.currency)} on {budget_phrase(budget)} "
            f"until {when_text(obj.ends_at, tenant_zone(obj))}.",
        )
        if budget.end_user_id is not None:
            home = reverse("admin:llm_budgets_enduser_change", args=[budget.end_user_id])
        elif budget.tenant_id is not None:
            home = reverse("admin:llm_budgets_tenant_change", args=[budget.tenant_id])
        else:
            home = reverse("admin:llm_budgets_budgetraise_changelist")
        return HttpResponseRedirect(home)

    @admin.display(description="Amount", ordering="amount")
    def amount_text(self, obj: BudgetRaise) -> str:
        return money_text(obj.amount, obj.budget.currency)

    @admin.display(description="Active now", boolean=True)
    def active(self, obj: BudgetRaise) -> bool:
        return obj.starts_at <= timezone.now() < obj.ends_at


class BurstFilter(admin.SimpleListFilter):
    """Identical refusals in a burst show as one row with a count unless asked for each."""

    title = "bursts"
    parameter_name = "bursts"
    EACH = "each"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.EACH, "Each refusal on its own row")]

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            if choice["display"] == "All":  # no parameter: the default, grouped
                choice["display"] = "Grouped, with a count"
            yield choice

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return None  # RefusalAdmin.get_queryset groups unless the parameter asks for each


@admin.register(Refusal)
class RefusalAdmin(ReadOnlyAdmin):
    """Why was I blocked? One row per burst of identical refusals (same tenant, end user, model
    and reason, each within ten minutes of the next) with a count, or one per refusal."""

    list_display = [
        "created_when",
        "count",
        "who",
        "model",
        "short_detail",
        "asked",
        "left",
        "resets",
    ]
    list_filter = [BurstFilter, "kind", ("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant", "end_user__tenant", "budget__tenant", "kill_switch"]
    search_fields = ["tenant__external_id", "end_user_external_id", "model", "detail"]
    date_hierarchy = "created_at"
    fields = readonly_fields = (
        "created_when",
        "tenant",
        "end_user_link",
        "provider",
        "model",
        "kind",
        "budget",
        "kill_switch",
        "detail",
        "asked",
        "left",
        "resets",
    )

    created_when = when_column("created_at", "When", seconds=True)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Refusal]:
        refusals = super().get_queryset(request)
        if request.GET.get(BurstFilter.parameter_name) == BurstFilter.EACH:
            return refusals
        # On the list only: a refusal's own page (and its history) is of that refusal.
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            return refusal_bursts(refusals)
        return refusals

    @admin.display(description="Count", ordering="burst_count")
    def count(self, obj: Refusal) -> str:
        total = getattr(obj, "burst_count", 1)
        if total <= 1:
            return ""
        since = when_text(getattr(obj, "burst_since", None), row_zone(obj), seconds=True)
        return format_html('<span title="since {}">&times;{}</span>', since, total)

    @admin.display(description="End user", ordering="end_user_external_id")
    def end_user_link(self, obj: Refusal) -> str:
        # A refused call names an end user it did not create: its id as asked, unlinked.
        if obj.end_user is None:
            return obj.end_user_external_id or "-"
        return end_user_link(obj.end_user)

    @admin.display(description="Who", ordering="tenant__external_id")
    def who(self, obj: Refusal) -> str:
        """Tenant and end user in one column (``acme/bob``, as end users are named): the list
        spans tenants and must fit beside the sidebar."""
        if obj.end_user is not None:
            return format_html('<a href="{}">{}</a>', end_user_url(obj.end_user), obj.end_user)
        tenant = obj.tenant.external_id if obj.tenant else "-"  # a global switch's refusal
        if obj.end_user_external_id:
            return f"{tenant}/{obj.end_user_external_id}"
        return tenant

    @admin.display(description="Budget or switch", ordering="detail")
    def short_detail(self, obj: Refusal) -> str:
        return truncated(obj.detail, 48)

    def _currency(self, obj: Refusal) -> str:
        return obj.budget.currency if obj.budget_id and obj.budget else "USD"

    @admin.display(description="Asked", ordering="requested")
    def asked(self, obj: Refusal) -> str:
        return money_text(obj.requested, self._currency(obj))

    @admin.display(description="Left", ordering="remaining")
    def left(self, obj: Refusal) -> str:
        return money_text(obj.remaining, self._currency(obj))

    @admin.display(description="Resets")
    def resets(self, obj: Refusal) -> str:
        zone = row_zone(obj)
        if obj.budget is not None:
            end = budget_period(obj.budget, obj.created_at).end
            return when_text(end, zone) if end else "never (lifetime)"
        switch = obj.kill_switch
        if switch is not None:
            if switch.cleared_at is not None:
                return f"cleared {when_text(switch.cleared_at, zone)}"
            if switch.auto_clear_at is not None:
                return when_text(switch.auto_clear_at, zone)
            return "when a person clears the switch"
        return "-"


class ResetForm(forms.Form):
    end_user = forms.CharField(help_text="The end user's external id.")
    reason = _reason("Why; kept in the audit log and shown on the compensating lines.")


class BudgetResetForm(forms.Form):
    api_key = forms.CharField(
        required=False,
        label="API key",
        help_text="The key's prefix: an each-key budget is reset for one key.",
    )
    reason = _reason("Why; kept in the audit log and shown on the compensating line.")

    def __init__(self, *args: Any, each_key: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if each_key:
            self.fields["api_key"].required = True
        else:
            del self.fields["api_key"]


class VoidForm(forms.Form):
    reason = _reason("Why; kept in the audit log and shown on the compensating line.")


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
                "<int:tenant_id>/reset-budget/<int:budget_id>/",
                wrap(self.reset_budget_view),
                name="llm_budgets_tenant_reset_budget",
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
                written = (
                    f"{len(lines)} compensating ledger line(s) written"
                    if lines
                    else "nothing was spent in this period, so nothing changed"
                )
                messages.success(
                    request,
                    f"Period spend of end user {tenant.external_id}/{end_user.external_id} "
                    f"reset: {written}.",
                )
                return HttpResponseRedirect(
                    reverse("admin:llm_budgets_enduser_change", args=[end_user.pk])
                )
        return _form_page(
            request,
            title=f"Reset an end user's period spend (tenant {tenant.external_id})",
            form=form,
            explanation=(
                "Brings the end user's own budgets back to zero spent for the current period "
                "with compensating ledger lines (nothing is deleted). The tenant's and global "
                "budgets keep the spend: that money was spent."
            ),
            back_url=_tenant_url(tenant),
            back_label=f"Tenant {tenant.external_id}",
            submit_label="Reset the period spend",
        )

    def reset_budget_view(
        self, request: HttpRequest, tenant_id: int, budget_id: int
    ) -> HttpResponse:
        _require(request, "reset_spend")
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        budget = get_object_or_404(
            Budget.objects.select_related("tenant", "api_key"), pk=budget_id, tenant=tenant
        )
        each_key = budget.scope == Scope.API_KEY_DEFAULT
        form = BudgetResetForm(request.POST or None, initial=request.GET, each_key=each_key)
        what = budget_phrase(budget)
        if request.method == "POST" and form.is_valid():
            try:
                key = api_key_of(tenant, form.cleaned_data["api_key"]) if each_key else None
                lines = budget_spend_reset(
                    budget=budget,
                    api_key=key,
                    reason=form.cleaned_data["reason"],
                    actor=actor(request),
                )
            except InvalidUsage as exc:
                form.add_error("api_key" if exc.field == "api_key" else None, exc.message)
            else:
                share = f" (API key {key.prefix}'s share)" if key is not None else ""
                written = (
                    f"{len(lines)} compensating ledger line(s) written"
                    if lines
                    else "nothing was spent in this period, so nothing changed"
                )
                messages.success(request, f"Period spend of {what}{share} reset: {written}.")
                return HttpResponseRedirect(_tenant_url(tenant))
        return _form_page(
            request,
            title=f"Reset the period spend of {what}",
            form=form,
            explanation=(
                "Brings this budget back to zero spent for the current period with a "
                "compensating ledger line (nothing is deleted). Calls in flight keep their "
                "holds; the tenant's, end users' and other budgets keep the spend."
            ),
            back_url=_tenant_url(tenant),
            back_label=f"Tenant {tenant.external_id}",
            submit_label="Reset the period spend",
        )

    def void_line_view(self, request: HttpRequest, tenant_id: int, line_id: int) -> HttpResponse:
        _require(request, "void_usagerecord")
        tenant = get_object_or_404(Tenant, pk=tenant_id)
        line = get_object_or_404(
            UsageRecord.objects.select_related("end_user"), pk=line_id, tenant=tenant
        )
        zone = tenant.timezone
        who = f"end user {line.end_user.external_id}" if line.end_user else "the tenant"
        what = (
            f"the {money.money(line.cost, line.currency)} {line.kind} for "
            f"{line.provider}/{line.model} of {who} at {when_text(line.created_at, zone)}"
        )
        form = VoidForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                usage_void(
                    record_id=line.pk, reason=form.cleaned_data["reason"], actor=actor(request)
                )
            except InvalidUsage as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(
                    request, f"Voided {what}: a compensating line of the opposite cost was added."
                )
                return HttpResponseRedirect(_tenant_url(tenant))
        return _form_page(
            request,
            title=f"Void a ledger line (tenant {tenant.external_id})",
            form=form,
            explanation=(
                f"Voiding {what[0].upper()}{what[1:]} adds a compensating line of the opposite "
                "cost; the line itself stays in the ledger."
            ),
            back_url=_tenant_url(tenant),
            back_label=f"Tenant {tenant.external_id}",
            submit_label="Void this line",
        )


def _tenant_url(tenant: Tenant) -> str:
    return reverse("admin:llm_budgets_tenant_change", args=[tenant.pk])


def _form_page(
    request: HttpRequest,
    *,
    title: str,
    form: forms.Form,
    explanation: str,
    back_url: str,
    back_label: str,
    submit_label: str,
) -> TemplateResponse:
    return TemplateResponse(
        request,
        "admin/llm_budgets/control/action_form.html",
        {
            **admin.site.each_context(request),
            "title": title,
            "form": form,
            "explanation": explanation,
            "back_url": back_url,
            "back_label": back_label,
            "submit_label": submit_label,
        },
    )


def _switch_rows(switches: Iterable[KillSwitch], zone: str | None) -> list[dict[str, Any]]:
    return [
        {
            "scope": s.scope_label,
            "reason": s.reason,
            "who": s.tripped_by or (f"detector {s.detector}" if s.automatic else "-"),
            "when": when_text(s.tripped_at, zone),
            "auto_clear": when_text(s.auto_clear_at, zone) if s.auto_clear_at else "",
            "url": reverse("admin:llm_budgets_killswitch_change", args=[s.pk]),
        }
        for s in switches
    ]


def _refusal_rows(refusals: list[Refusal], zone: str | None) -> list[dict[str, Any]]:
    rows = []
    for group in refusal_groups(refusals):
        r = group.first
        currency = r.budget.currency if r.budget_id and r.budget else ""
        rows.append(
            {
                "when": when_text(r.created_at, zone, seconds=True),
                "since": when_text(group.oldest_at, zone, seconds=True) if group.count > 1 else "",
                "count": group.count,
                "end_user": r.end_user.external_id if r.end_user else "-",
                "end_user_url": end_user_url(r.end_user),
                "model": r.model,
                "why": r.detail,
                "requested": money_text(r.requested, currency),
                "remaining": money_text(r.remaining, currency),
                "url": reverse("admin:llm_budgets_refusal_change", args=[r.pk]),
            }
        )
    return rows


def _line_rows(
    lines: list[UsageRecord], tenant: Tenant, can_void: bool, zone: str | None
) -> list[dict[str, Any]]:
    voided = voided_ids(lines)
    notes = adjustment_notes(lines)
    rows = []
    for line in lines:
        note = notes.get(line.pk)
        if line.kind == UsageKind.ADJUSTMENT:
            what = f"voids line {line.voids_id}" if line.voids_id else "end user's spend reset"
            status = f"{what}: “{note.reason}” by {note.actor or '?'}" if note else what
        elif line.pk in voided:
            status = f"voided by line {voided[line.pk]}"
        else:
            status = ""
        rows.append(
            {
                "id": line.pk,
                "url": reverse("admin:llm_budgets_usagerecord_change", args=[line.pk]),
                "when": when_text(line.created_at, zone, seconds=True),
                "end_user": line.end_user.external_id if line.end_user else "-",
                "end_user_url": end_user_url(line.end_user),
                "kind": line.kind,
                "call": f"{line.provider}/{line.model}" if line.model else "-",
                "cost": money_text(line.cost, line.currency),
                "status": status,
                "voided": line.pk in voided,
                "void_url": reverse("admin:llm_budgets_tenant_void_line", args=[tenant.pk, line.pk])
                if can_void and line.kind != UsageKind.ADJUSTMENT and line.pk not in voided
                else None,
            }
        )
    return rows


def control_context(request: HttpRequest, tenant: Tenant, now: datetime) -> dict[str, Any]:
    """The tenant page's control sections: open switches, recent refusals, recent ledger lines
    (with void links for billing admins) and the action links the user may use."""
    user = request.user
    zone = tenant.timezone
    # Only switches refusing calls now: one past its auto_clear_at no longer does.
    switches = KillSwitch.objects.filter(switch_open_q(now), tenant=tenant).select_related(
        "tenant", "end_user__tenant"
    )
    refusals = Refusal.objects.filter(tenant=tenant).select_related("end_user", "budget")[
        :RECENT_REFUSALS
    ]
    lines = UsageRecord.objects.filter(tenant=tenant).select_related("end_user")[:RECENT_LINES]
    actions = []
    if user.has_perm("llm_budgets.add_killswitch"):
        actions.append(
            ("Trip a kill switch on this tenant", _add_url("killswitch", tenant=tenant.pk))
        )
    if user.has_perm("llm_budgets.add_budgetraise"):
        actions.append(("Grant a temporary raise", _add_url("budgetraise", tenant=tenant.pk)))
    if user.has_perm("llm_budgets.reset_spend"):
        actions.append(
            (
                "Reset an end user's period spend",
                reverse("admin:llm_budgets_tenant_reset_end_user", args=[tenant.pk]),
            )
        )
    if user.has_perm("llm_budgets.add_budget"):
        actions.append(
            (
                "Add an API key, run or tag budget",
                _add_url("budget", tenant=tenant.pk, scope=Scope.TAG.value),
            )
        )
    return {
        "control_actions": actions,
        "switch_rows": _switch_rows(switches, zone),
        "refusal_rows": _refusal_rows(list(refusals), zone),
        "refusals_url": (
            f"{reverse('admin:llm_budgets_refusal_changelist')}?tenant__id__exact={tenant.pk}"
        ),
        "line_rows": _line_rows(
            list(lines), tenant, user.has_perm("llm_budgets.void_usagerecord"), zone
        ),
        "lines_url": (
            f"{reverse('admin:llm_budgets_usagerecord_changelist')}?tenant__id__exact={tenant.pk}"
        ),
    }


def end_user_context(
    request: HttpRequest, end_user: EndUser, overview: EndUserOverview
) -> dict[str, Any]:
    """The end-user page's control sections and actions, scoped to the end user."""
    user = request.user
    tenant = end_user.tenant
    zone = tenant.timezone
    actions = []
    if user.has_perm("llm_budgets.add_killswitch"):
        actions.append(
            (
                "Trip a kill switch on this end user",
                _add_url("killswitch", tenant=tenant.pk, end_user_id=end_user.external_id),
            )
        )
    if user.has_perm("llm_budgets.reset_spend"):
        reset = reverse("admin:llm_budgets_tenant_reset_end_user", args=[tenant.pk])
        actions.append(
            (
                "Reset this end user's period spend",
                f"{reset}?{urlencode({'end_user': end_user.external_id})}",
            )
        )
    return {
        "control_actions": actions,
        "switch_rows": _switch_rows(overview.switches, zone),
        "refusal_rows": _refusal_rows(overview.refusals, zone),
        "refusals_url": (
            f"{reverse('admin:llm_budgets_refusal_changelist')}?end_user__id__exact={end_user.pk}"
        ),
        "line_rows": _line_rows(
            overview.lines, tenant, user.has_perm("llm_budgets.void_usagerecord"), zone
        ),
        "lines_url": (
            f"{reverse('admin:llm_budgets_usagerecord_changelist')}?end_user__id__exact={end_user.pk}"
        ),
    }


def _add_url(model_name: str, **initial: str | int) -> str:
    """An add form pre-filled with ``initial`` (the admin reads it from the query string)."""
    return f"{reverse(f'admin:llm_budgets_{model_name}_add')}?{urlencode(initial)}"
