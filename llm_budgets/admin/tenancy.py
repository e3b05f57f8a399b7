"""Plans, tenants and end users. Tenant and end-user writes go through the tenancy services."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, Model
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import urlencode

from llm_budgets import clock, validation
from llm_budgets.admin.base import (
    AppAdmin,
    actor,
    adopt,
    clean_identifier,
    end_user_url,
    limit_text,
    money_text,
    short_id,
    when_column,
    when_text,
)
from llm_budgets.admin.billing import billing_context
from llm_budgets.admin.control import TenantControlMixin, control_context, end_user_context
from llm_budgets.conf import conf
from llm_budgets.control.self_serve import (
    self_serve_ceiling,
    self_serve_enabled,
    tenant_self_serve_set,
)
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    LIVE_STATES,
    BudgetRaise,
    EndUser,
    Plan,
    Reservation,
    Scope,
    Tenant,
    Window,
)
from llm_budgets.models.fields import validate_email_list
from llm_budgets.money import display
from llm_budgets.money import money as money_words
from llm_budgets.reads.overviews import (
    ScopedSubject,
    active_raises,
    end_user_overview,
    tenant_overview,
)
from llm_budgets.results import BudgetStatus
from llm_budgets.tenancy.tenants import end_user_ensure, tenant_ensure


class _EmptyWhenNone(forms.JSONField):
    """A JSON box that shows nothing (not ``null``) when the value is unset."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


@admin.register(Plan)
class PlanAdmin(AppAdmin):
    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "warning_thresholds":
            kwargs["form_class"] = _EmptyWhenNone
            kwargs["help_text"] = (
                "Percentages of a budget that trigger a warning email, e.g. [50, 80, 100]. "
                f"Empty: the site's default, {list(conf.WARNING_THRESHOLDS)}."
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

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


_SWITCH_CHOICES = [
    ("", "As its plan"),
    ("on", "On for this tenant"),
    ("off", "Off for this tenant"),
]
_SWITCH_VALUES: dict[str, bool | None] = {"": None, "on": True, "off": False}


def _switch_value(enabled: bool | None) -> str:
    return "" if enabled is None else ("on" if enabled else "off")


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
        ]
        widgets = {"timezone": forms.Select(choices=clock.timezone_choices())}

    # Not a column: the tenant's billing-contacts email endpoint (alerts.endpoints), which
    # tenant_ensure sets from it.
    billing_emails = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Billing contacts who receive budget warnings: addresses separated by commas "
        "or new lines (their email endpoint, under Alerts).",
    )

    # Not model fields on this form: the operators' self-serve override, saved only through
    # control.self_serve.tenant_self_serve_set (audited ``tenant.self_serve``).
    self_serve_switch = forms.ChoiceField(
        label="Self-serve",
        choices=_SWITCH_CHOICES,
        required=False,
        help_text="Whether the tenant's admins may manage their people's budgets, keys and "
        "alerts from the usage pages: the plan's setting, or on or off for this tenant.",
    )
    self_serve_ceiling_override = forms.CharField(
        label="Self-serve ceiling",
        required=False,
        help_text="The most a tenant admin may set for one budget, e.g. 50 or 12.50. "
        "Empty: the plan's ceiling.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["billing_emails"].initial = self.instance.billing_emails
            self.fields["self_serve_switch"].initial = _switch_value(self.instance.self_serve)
            ceiling = self.instance.self_serve_ceiling
            self.fields["self_serve_ceiling_override"].initial = (
                "" if ceiling is None else display(ceiling)
            )

    def clean_self_serve_switch(self) -> bool | None:
        return _SWITCH_VALUES[self.cleaned_data.get("self_serve_switch") or ""]

    def clean_self_serve_ceiling_override(self) -> Decimal | None:
        value = (self.cleaned_data.get("self_serve_ceiling_override") or "").strip()
        if not value:
            return None
        try:
            # The service's own rule (tenant_self_serve_set validates the same way), so a
            # refusal shows beside the field before anything is written.
            return validation.money("ceiling", value)
        except InvalidUsage as exc:
            raise ValidationError(exc.message) from None

    def clean_billing_emails(self) -> str:
        value: str = self.cleaned_data.get("billing_emails") or ""
        validate_email_list(value)
        return value

    def clean_external_id(self) -> str:
        return clean_identifier("tenant", self.cleaned_data.get("external_id"))

    def clean_plan(self) -> Plan | None:
        plan: Plan | None = self.cleaned_data["plan"]
        if plan is None and self.instance.plan_id is not None:
            # tenant_ensure reads "no plan" as "unchanged"; refuse rather than pretend to clear it.
            raise ValidationError("A tenant's plan cannot be removed here; choose another plan.")
        return plan


@admin.register(Tenant)
class TenantAdmin(TenantControlMixin, AppAdmin):
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
        "self_serve_switch",
        "self_serve_ceiling_override",
        "self_serve_now",
        "created_when",
    ]
    list_display = [
        "external_id",
        "name",
        "plan",
        "timezone",
        "billing_day",
        "self_serve_column",
        "created_when",
    ]
    list_filter = ["plan", "timezone"]
    list_select_related = ["plan"]
    search_fields = ["external_id", "name"]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # The host's id is how tenant_ensure finds the tenant: fixed once created.
        if obj is not None:
            return ["external_id", "self_serve_now", "created_when"]
        return ["self_serve_now", "created_when"]

    created_when = when_column("created_at", "Created")

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
            billing_emails=form.cleaned_data.get("billing_emails", ""),
            markup_percent=obj.markup_percent,
            actor=actor(request),
        )
        enabled = form.cleaned_data.get("self_serve_switch")
        ceiling = form.cleaned_data.get("self_serve_ceiling_override")
        if (enabled, ceiling) != (saved.self_serve, saved.self_serve_ceiling):
            # The override's one writer (audited); the admin's change form is atomic, so a
            # refusal here leaves the tenant_ensure above unwritten too.
            saved = tenant_self_serve_set(
                saved,
                enabled=enabled,
                ceiling=ceiling,
                actor=actor(request),
                reason="set in the admin",
            )
        adopt(obj, saved)

    @admin.display(description="Self-serve now")
    def self_serve_now(self, obj: Tenant | None) -> str:
        if obj is None or obj.pk is None:
            return "Set by the plan until the tenant is saved."
        return _self_serve_words(obj)

    @admin.display(description="Self-serve", ordering="self_serve")
    def self_serve_column(self, obj: Tenant) -> str:
        on = self_serve_enabled(obj)
        source = "plan" if obj.self_serve is None else "tenant"
        return f"{'On' if on else 'Off'} ({source})"

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Tenant | None = None,
    ) -> HttpResponse:
        context["show_save_and_add_another"] = False
        if obj is not None and obj.pk is not None:
            if context["adminform"].form.errors:
                obj = Tenant.objects.get(pk=obj.pk)  # the stored tenant, not the rejected edit
            context.update(_overview_context(request, obj))
            context.update(control_context(request, obj, timezone.now()))
            context.update(billing_context(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)


def _self_serve_words(tenant: Tenant) -> str:
    """The effective switch and ceiling in words, and whose they are (plan or tenant)."""
    plan = tenant.plan.name if tenant.plan is not None else ""
    if tenant.self_serve is not None:
        switch_from = "set on this tenant"
    elif plan:
        switch_from = f"plan {plan}"
    else:
        switch_from = "no plan: off by default"
    switch = f"{'On' if self_serve_enabled(tenant) else 'Off'} ({switch_from})"
    ceiling = self_serve_ceiling(tenant)
    if ceiling is None:
        return f"{switch}; no ceiling set, so tenant admins cannot set budgets."
    ceiling_from = "set on this tenant" if tenant.self_serve_ceiling is not None else f"plan {plan}"
    return f"{switch}; at most {money_words(ceiling, conf.CURRENCY)} per budget ({ceiling_from})."


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


def _overview_context(request: HttpRequest, tenant: Tenant) -> dict[str, Any]:
    now = timezone.now()
    overview = tenant_overview(tenant, now)
    zone = tenant.timezone
    by_tenant: dict[str, str | int] = {"tenant__id__exact": tenant.pk}
    statuses = sorted(overview.budgets, key=lambda s: _SCOPE_ORDER[s.scope])
    raises = active_raises(
        [s.budget_id for s in [*statuses, *overview.end_user_budgets, *overview.scoped_budgets]],
        now,
    )
    can_raise = request.user.has_perm("llm_budgets.add_budgetraise")
    can_reset = request.user.has_perm("llm_budgets.reset_spend")
    return {
        "overview_timezone": zone,
        "budget_rows": [
            _budget_row(s, raises, zone, can_raise, overview.created) for s in statuses
        ],
        "end_user_budget_rows": [
            _budget_row(s, raises, zone, can_raise, overview.created)
            for s in overview.end_user_budgets
        ],
        "end_user_budget_count": overview.end_user_budget_count,
        "scoped_budget_rows": [
            {
                **_budget_row(s, raises, zone, can_raise, overview.created),
                "reset_url": _reset_url(tenant, s, subject) if can_reset else "",
            }
            for s, subject in zip(overview.scoped_budgets, overview.scoped_subjects, strict=True)
        ],
        "end_user_budgets_url": _changelist(
            "budget", {**by_tenant, "scope__exact": Scope.END_USER}
        ),
        "end_user_search_url": reverse("admin:llm_budgets_enduser_changelist"),
        "end_user_search_tenant": tenant.pk,
        "reservation_rows": _reservation_rows(overview.open_reservations, zone, now),
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
            *_usage_pages_link(tenant),
        ],
    }


def _usage_pages_link(tenant: Tenant) -> list[tuple[str, str]]:
    """The tenant's usage pages as support sees them (``?tenant=``), where the host mounts them."""
    try:
        pages = reverse("llm_budgets_pages:overview")
    except NoReverseMatch:
        return []
    return [("Usage pages", f"{pages}?{urlencode({'tenant': tenant.external_id})}")]


def _reservation_rows(reservations: list[Reservation], zone: str, now: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": short_id(r.pk),
            "full_id": str(r.pk),
            "url": reverse("admin:llm_budgets_reservation_change", args=[r.pk]),
            "end_user": r.end_user.external_id if r.end_user else "-",
            "end_user_url": end_user_url(r.end_user),
            "model": f"{r.provider}/{r.model}",
            "state": r.get_state_display(),
            "amount": money_text(r.amount, r.currency),
            "created_at": when_text(r.created_at, zone, seconds=True),
            "expires_at": when_text(r.expires_at, zone, seconds=True),
            "overdue": r.expires_at <= now,
        }
        for r in reservations
    ]


def _budget_row(
    status: BudgetStatus,
    raises: Mapping[int, list[BudgetRaise]],
    zone: str,
    can_raise: bool,
    created: Mapping[int, datetime],
) -> dict[str, Any]:
    used = status.spent + status.reserved
    created_at = created.get(status.budget_id)
    return {
        # Created during this period: it is not retroactive, so say from when it counts.
        "counts_from": when_text(created_at, zone)
        if created_at is not None and created_at > status.period_start
        else "",
        "url": reverse("admin:llm_budgets_budget_change", args=[status.budget_id]),
        "scope": status.scope_label,
        "window": status.window,
        "limit": limit_text(status.limit, raises.get(status.budget_id, []), status.currency, zone),
        "spent": money_text(status.spent, status.currency),
        "reserved": money_text(status.reserved, status.currency),
        "remaining": money_text(status.remaining, status.currency),
        "used_percent": min(100, int(used * 100 / status.limit)) if status.limit else 100,
        "exhausted": status.remaining == 0,
        # A lifetime window has no start to speak of (the epoch): it counts from the budget on.
        "period_start": "its lifetime"
        if status.window == Window.LIFETIME
        else when_text(status.period_start, zone),
        "resets_at": when_text(status.resets_at, zone) if status.resets_at else "",
        "raise_url": _raise_url(status.budget_id)
        # Not on "*" (it would raise every end user, key or run) nor global (every tenant).
        if can_raise and status.scope in _RAISABLE
        else "",
    }


_RAISABLE = (Scope.TENANT, Scope.END_USER, Scope.API_KEY, Scope.RUN, Scope.TAG)


def _reset_url(tenant: Tenant, status: BudgetStatus, subject: ScopedSubject) -> str:
    """The reset form of a tag or API key budget (for an each-key budget, of this key's
    share); "" for other scopes."""
    url = reverse("admin:llm_budgets_tenant_reset_budget", args=[tenant.pk, status.budget_id])
    if status.scope in (Scope.TAG, Scope.API_KEY):
        return url
    if status.scope == Scope.API_KEY_DEFAULT:
        return f"{url}?{urlencode({'api_key': subject.name})}"
    return ""


def _raise_url(budget_id: int) -> str:
    return f"{reverse('admin:llm_budgets_budgetraise_add')}?{urlencode({'budget': budget_id})}"


def _changelist(model_name: str, params: Mapping[str, str | int]) -> str:
    return f"{reverse(f'admin:llm_budgets_{model_name}_changelist')}?{urlencode(params)}"


class EndUserForm(forms.ModelForm):
    class Meta:
        model = EndUser
        fields = ["tenant", "external_id"]

    def clean_external_id(self) -> str:
        return clean_identifier("end_user", self.cleaned_data.get("external_id"))


@admin.register(EndUser)
class EndUserAdmin(AppAdmin):
    """End users are created by end_user_ensure (here or on first request); never edited. An end
    user's page shows where it stands: budgets, holds, ledger lines, refusals, switches."""

    form = EndUserForm
    list_display = ["external_id", "tenant", "created_when"]
    list_select_related = ["tenant"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["external_id", "tenant__external_id", "tenant__name"]
    date_hierarchy = "created_at"
    autocomplete_fields = ["tenant"]
    fields = ["tenant", "external_id", "created_when"]
    readonly_fields = ["created_when"]

    created_when = when_column("created_at", "First seen")

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Its external id is the host's key: renaming or moving it would split its history.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: EndUser, form: Any, change: bool) -> None:
        saved = end_user_ensure(obj.tenant, obj.external_id)
        adopt(obj, saved)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: EndUser | None = None,
    ) -> HttpResponse:
        if obj is not None and obj.pk is not None:
            context.update(_end_user_page(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)


def _end_user_page(request: HttpRequest, end_user: EndUser) -> dict[str, Any]:
    now = timezone.now()
    tenant = end_user.tenant
    zone = tenant.timezone
    overview = end_user_overview(end_user, now)
    raises = active_raises([s.budget_id for s in [*overview.budgets, *overview.runs]], now)
    can_raise = request.user.has_perm("llm_budgets.add_budgetraise")
    rows = []
    for status in sorted(overview.budgets, key=lambda s: _SCOPE_ORDER[s.scope]):
        row = _budget_row(status, raises, zone, can_raise, overview.created)
        if status.scope == Scope.END_USER_DEFAULT and request.user.has_perm(
            "llm_budgets.add_budget"
        ):
            # A raise on "each end user" would raise everyone: give this one a budget instead.
            prefill: dict[str, str | int] = {
                "scope": str(Scope.END_USER),
                "tenant": tenant.pk,
                "end_user": end_user.pk,
                "window": status.window,
                "limit": display(status.limit),
            }
            add = reverse("admin:llm_budgets_budget_add")
            row["own_budget_url"] = f"{add}?{urlencode(prefill)}"
        rows.append(row)
    return {
        "overview_timezone": zone,
        "tenant_url": reverse("admin:llm_budgets_tenant_change", args=[tenant.pk]),
        "tenant_label": tenant.external_id,
        "budget_rows": rows,
        "run_rows": [
            _budget_row(s, raises, zone, can_raise, overview.created) for s in overview.runs
        ],
        "reservation_rows": _reservation_rows(overview.open_reservations, zone, now),
        "open_reservation_count": overview.open_reservation_count,
        "open_reservations_url": _changelist(
            "reservation",
            {"end_user__id__exact": end_user.pk, "state__in": ",".join(LIVE_STATES)},
        ),
        **end_user_context(request, end_user, overview),
    }
