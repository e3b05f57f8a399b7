"""The tenant admin's forms (self-serve, docs/pages.md "Tenant admins act"): budgets for their
people, keys, runs and tags; raises; a user's period reset; API keys; alert subscriptions.

Thin: each form checks its shape, then calls the one service the support admin calls, with
``acting=`` (control/self_serve.py), which checks the permission, the tenant and the ceiling again
and audits the person. Rows named in a URL are looked up within the viewer's tenant only, so
another tenant's id is a 404 whatever it is; ids typed in a form go to the service with the
acting tenant, never a tenant from the request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django import forms
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods

from llm_budgets import validation
from llm_budgets.alerts.bodies import TYPES
from llm_budgets.alerts.endpoints import EndpointNotFound, endpoint_get
from llm_budgets.alerts.self_serve import self_serve_subscribe, self_serve_unsubscribe
from llm_budgets.conf import conf
from llm_budgets.control.api_keys import api_key_create, api_key_revoke
from llm_budgets.control.limits import ALL, budget_remove, budget_set_limit
from llm_budgets.control.raises import budget_raise_grant, budget_raise_revoke
from llm_budgets.control.self_serve import (
    SELF_SERVE_SCOPES,
    TenantAdmin,
    raise_target,
    self_serve_actions,
    self_serve_ceiling,
    self_serve_enabled,
    self_serve_room,
)
from llm_budgets.engine.adjustments import end_user_spend_reset
from llm_budgets.exceptions import BudgetError, InvalidUsage, SelfServeDenied
from llm_budgets.models import (
    AlertEndpoint,
    ApiKey,
    Budget,
    BudgetRaise,
    EndpointKind,
    EndUser,
    Scope,
)
from llm_budgets.money import money as money_text
from llm_budgets.pages.access import LoginRequired, TenantChoice, Viewer, viewer_for
from llm_budgets.pages.views import _context, private
from llm_budgets.reads import usage
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.windows import Window

# What a budget form sets: (value, label, the service's keyword, whether it names one).
KINDS = [
    ("end_user", gettext_lazy("One user"), "end_user", True),
    ("end_user_default", gettext_lazy("Each user (the default)"), "end_user", False),
    ("api_key", gettext_lazy("One API key"), "api_key", True),
    ("api_key_default", gettext_lazy("Each API key"), "api_key", False),
    ("run", gettext_lazy("One run"), "run", True),
    ("run_default", gettext_lazy("Each run"), "run", False),
    ("tag", gettext_lazy("One tag (key=value)"), "tag", True),
]
WINDOWS = [
    (Window.DAY, gettext_lazy("Per day")),
    (Window.MONTH, gettext_lazy("Per billing month")),
    (Window.HOUR, gettext_lazy("Per hour")),
    (Window.LIFETIME, gettext_lazy("In total (lifetime)")),
]
RAISE_HOURS = [
    (1, gettext_lazy("1 hour")),
    (24, gettext_lazy("1 day")),
    (168, gettext_lazy("7 days")),
]
ALERT_KINDS = [
    (EndpointKind.EMAIL.value, gettext_lazy("Email")),
    (EndpointKind.WEBHOOK.value, gettext_lazy("Signed webhook (JSON)")),
    (EndpointKind.SLACK.value, gettext_lazy("Slack incoming webhook")),
    (EndpointKind.TEAMS.value, gettext_lazy("Microsoft Teams incoming webhook")),
]
# What a tenant's own events are called on the form (docs/alerts.md has their bodies); a type
# added later shows its name until it gets words here.
EVENT_LABELS = {
    "threshold.crossed": gettext_lazy("A budget crosses a warning threshold"),
    "budget.projected_to_exceed": gettext_lazy("A budget is projected to run out this month"),
    "budget.exhausted": gettext_lazy("A budget refuses its first call"),
    "kill_switch.tripped": gettext_lazy("A kill switch stops calls"),
    "kill_switch.cleared": gettext_lazy("A kill switch is cleared"),
    "run.closed": gettext_lazy("A run is closed"),
    "hold.expired": gettext_lazy("A call's hold expires unsettled"),
    "payment.failed": gettext_lazy("A payment fails"),
    "alert.test": gettext_lazy("Test alerts"),
}


class MoneyField(forms.CharField):
    """An amount as the viewer's locale writes it (``4,20`` or ``4.20``), then checked by the
    services' own rule (``validation.money``): exact, non-negative, stored precision."""

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text in self.empty_values:
            return None
        try:
            return validation.money("amount", formats.sanitize_separators(str(text).strip()))
        except InvalidUsage:
            raise forms.ValidationError(
                _(
                    "Write an amount such as 5 or 4.20: digits and at most one decimal mark, "
                    "no sign and no currency."
                )
            ) from None


class PageForm(forms.Form):
    """The page holds several forms: each has ids of its own (``lb-<form>-<field>``), so no two
    labels point at one id, and no label suffix (screen readers read the label as written)."""

    id_prefix = "form"
    section = "lb-manage"  # the page's section that holds it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", f"lb-{self.id_prefix}-%s")
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


class BudgetForm(PageForm):
    id_prefix = "budget"
    section = "lb-budgets"  # the page's section that holds it

    kind = forms.ChoiceField(label=gettext_lazy("For"), choices=[(k[0], k[1]) for k in KINDS])
    who = forms.CharField(
        label=gettext_lazy("Which one"),
        required=False,
        max_length=255,
        help_text=gettext_lazy(
            "A user's id, an API key's prefix, a run's id, or a tag as key=value; empty for 'each'."
        ),
    )
    window = forms.ChoiceField(label=gettext_lazy("Window"), choices=WINDOWS)
    amount = MoneyField(label=gettext_lazy("Limit"))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        named = next((k[3] for k in KINDS if k[0] == data.get("kind")), False)
        who = (data.get("who") or "").strip()
        if named and not who:
            self.add_error("who", _("Name the user, key, run or tag this budget is for."))
        if not named and who:
            self.add_error("who", _("Leave this empty for a default that applies to each one."))
        if data.get("kind") == "tag" and who and "=" not in who:
            self.add_error("who", _("Write the tag as key=value, e.g. project=alpha."))
        return data

    def service_kwargs(self) -> dict[str, Any]:
        """The scope keyword ``budget_set_limit`` takes for this form."""
        kind, who = self.cleaned_data["kind"], self.cleaned_data["who"].strip()
        keyword = next(k[2] for k in KINDS if k[0] == kind)
        if kind == "tag":
            return {"tag": tuple(who.split("=", 1))}
        return {keyword: who or ALL}


class RaiseForm(PageForm):
    id_prefix = "raise"
    section = "lb-raises"  # the page's section that holds it

    user = forms.CharField(label=gettext_lazy("User id"), max_length=255)
    window = forms.ChoiceField(label=gettext_lazy("Budget window"), choices=WINDOWS)
    amount = MoneyField(label=gettext_lazy("Extra amount"))
    hours = forms.TypedChoiceField(
        label=gettext_lazy("For"), choices=RAISE_HOURS, coerce=int, initial=24
    )
    reason = forms.CharField(label=gettext_lazy("Why"), max_length=500)


class ResetForm(PageForm):
    id_prefix = "reset"
    section = "lb-reset"  # the page's section that holds it

    user = forms.CharField(label=gettext_lazy("User id"), max_length=255)
    reason = forms.CharField(label=gettext_lazy("Why"), max_length=500)


class KeyForm(PageForm):
    id_prefix = "key"
    section = "lb-keys"  # the page's section that holds it

    name = forms.CharField(label=gettext_lazy("Name"), max_length=50)
    expires = forms.DateField(
        label=gettext_lazy("Expires on"),
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text=gettext_lazy("Empty: it never expires (revoke it when it is no longer used)."),
    )


class AlertForm(PageForm):
    id_prefix = "alert"
    section = "lb-alerts"  # the page's section that holds it

    kind = forms.ChoiceField(label=gettext_lazy("Send to"), choices=ALERT_KINDS)
    target = forms.CharField(
        label=gettext_lazy("Address"),
        max_length=2000,
        help_text=gettext_lazy("An email address, or the https:// URL of the endpoint."),
    )
    event_types = forms.MultipleChoiceField(
        label=gettext_lazy("Events"),
        choices=[],
        widget=forms.CheckboxSelectMultiple,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["event_types"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [
            (name, EVENT_LABELS.get(name, name)) for name, t in TYPES.items() if t.tenant_visible
        ]


F = TypeVar("F", bound=PageForm)


# --- access -------------------------------------------------------------------------------


def manage_page(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """A tenant admin's page: anyone else gets 403 (members, support staff looking with
    ``?tenant=``, who act in the admin), as does everyone when self-serve is off for the tenant.
    The services check again: this only decides what to show."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            viewer = viewer_for(request)
        except LoginRequired:
            return redirect_to_login(request.get_full_path())
        except TenantChoice:
            raise PermissionDenied(_("Support staff change budgets in the admin.")) from None
        if viewer.is_member:
            raise PermissionDenied(_("Only your organisation's admins manage budgets and keys."))
        if viewer.staff:
            raise PermissionDenied(_("Support staff change budgets in the admin."))
        if not self_serve_enabled(viewer.tenant):
            raise PermissionDenied(
                _("Managing budgets here is not turned on for your organisation; ask support.")
            )
        user = request.user
        acting = TenantAdmin(tenant=viewer.tenant, person=user.get_username(), user_id=user.pk)
        return view(request, viewer, acting, *args, **kwargs)

    return require_http_methods(["GET", "POST"])(private(wrapper))


def _allowed(viewer: Viewer, action: str) -> None:
    """A hidden action's URLs answer 403 like a member's."""
    if action not in self_serve_actions(viewer.tenant):
        raise PermissionDenied(_("This installation does not offer this action here."))


def _home(anchor: str = "") -> str:
    return reverse("llm_budgets_pages:manage") + (f"#{anchor}" if anchor else "")


# --- the page -----------------------------------------------------------------------------


def _page(
    request: HttpRequest,
    viewer: Viewer,
    *,
    status: int = 200,
    message: str = "",
    bound: dict[str, forms.Form] | None = None,
    **named: forms.Form,
) -> HttpResponse:
    forms_ = {**named, **(bound or {})}
    tenant = viewer.tenant
    now = timezone.now()
    currency = conf.CURRENCY
    ceiling = self_serve_ceiling(tenant)
    budgets = list(
        Budget.objects.filter(tenant=tenant, scope__in=SELF_SERVE_SCOPES)
        .select_related("tenant", "end_user", "api_key", "run")
        .order_by("scope", "pk")
    )
    raises = list(
        BudgetRaise.objects.filter(budget__tenant=tenant, ends_at__gt=now)
        .select_related("budget__tenant", "budget__end_user")
        .order_by("ends_at")
    )
    keys = list(ApiKey.objects.filter(tenant=tenant).order_by("-created"))
    endpoints = list(AlertEndpoint.objects.filter(tenant=tenant).order_by("pk"))
    context = _context(
        request,
        viewer,
        "manage",
        actions=self_serve_actions(tenant),
        ceiling=ceiling,
        rooms=[
            (label, self_serve_room(tenant, str(value)))
            for value, label in WINDOWS
            if value != Window.LIFETIME
        ],
        budgets=[(b, budget_who(b), window_label(b.window)) for b in budgets],
        raises=[(r, budget_who(r.budget), window_label(r.budget.window)) for r in raises],
        keys=keys,
        endpoints=endpoints,
        budget_form=forms_.get("budget_form") or BudgetForm(),
        raise_form=forms_.get("raise_form") or RaiseForm(),
        reset_form=forms_.get("reset_form") or ResetForm(),
        key_form=forms_.get("key_form") or KeyForm(),
        alert_form=forms_.get("alert_form") or AlertForm(),
        message=message,
        now=now,
        money_currency=currency,
    )
    return render(request, "llm_budgets/pages/manage.html", context, status=status)


@manage_page
def manage(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    done = DONE.get(request.GET.get("done", ""))
    return _page(request, viewer, message=str(done) if done else "")


def _refused(
    request: HttpRequest, viewer: Viewer, form: forms.Form, name: str, exc: BudgetError
) -> HttpResponse:
    """The page again with the service's refusal beside the field it names (400), or above the
    form (403 for a permission, 400 otherwise): nothing was written."""
    field = getattr(exc, "field", None)
    if field in form.fields:
        form.add_error(field, exc.message)
    else:
        form.add_error(None, exc.message)
    status = 403 if isinstance(exc, SelfServeDenied) and field is None else 400
    return _page(request, viewer, status=status, bound={name: form})


# What the page says after a change (?done=<code>): fixed words, so a link cannot make the page
# say something else; the lists below show the change itself.
DONE = {
    "budget_set": gettext_lazy("The budget is set."),
    "budget_removed": gettext_lazy("The budget is removed."),
    "raise_granted": gettext_lazy("The raise is granted."),
    "raise_ended": gettext_lazy("The raise has ended."),
    "spend_reset": gettext_lazy("The user's spend is reset."),
    "key_revoked": gettext_lazy("The API key is revoked."),
    "alerts_subscribed": gettext_lazy("Alerts are subscribed."),
    "alerts_stopped": gettext_lazy("Those alerts are stopped."),
}


def _done(code: str, anchor: str) -> HttpResponse:
    """Back to the page (POST, redirect, GET), saying what changed."""
    return redirect(f"{reverse('llm_budgets_pages:manage')}?done={code}#{anchor}")


def _confirm(
    request: HttpRequest,
    viewer: Viewer,
    *,
    title: str,
    body: list[str],
    fields: dict[str, Any],
    button: str,
    danger: bool = True,
) -> HttpResponse:
    context = _context(
        request,
        viewer,
        "manage",
        title=title,
        body=body,
        fields=fields,
        button=button,
        danger=danger,
        back=_home(),
    )
    return render(request, "llm_budgets/pages/confirm.html", context)


def _posted(
    request: HttpRequest, viewer: Viewer, action: str, form_class: type[F], name: str
) -> F | HttpResponse:
    """A form's POST, valid; else what to answer: the page at its section (GET), or the page
    with the form's errors beside their fields (400)."""
    _allowed(viewer, action)
    if request.method != "POST":
        return redirect(_home(form_class.section))
    form = form_class(request.POST)
    if not form.is_valid():
        return _page(request, viewer, status=400, bound={name: form})
    return form


def _destructive(
    request: HttpRequest,
    viewer: Viewer,
    *,
    title: str,
    body: str,
    button: str,
    act: Callable[[], object],
    done: tuple[str, str],
) -> HttpResponse:
    """A change that cannot be taken back: a confirmation page on GET, the change on POST (its
    refusal on the page, nothing written), then back to the page saying so."""
    if request.method != "POST":
        return _confirm(request, viewer, title=title, body=[body], fields={}, button=button)
    try:
        act()
    except BudgetError as exc:
        return _page(request, viewer, status=400, message=exc.message)
    return _done(*done)


# --- budgets ------------------------------------------------------------------------------


@manage_page
def budget_set(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    form = _posted(request, viewer, "budgets", BudgetForm, "budget_form")
    if isinstance(form, HttpResponse):
        return form
    data = form.cleaned_data
    amount: Decimal = data["amount"]
    if request.POST.get("confirm") != "yes":
        return _confirm(
            request,
            viewer,
            title=_("Set this budget?"),
            body=_preview(viewer, form),
            fields={k: request.POST.get(k, "") for k in ("kind", "who", "window", "amount")},
            button=_("Set the budget"),
            danger=False,
        )
    try:
        budget_set_limit(
            tenant=viewer.tenant.external_id,
            amount=amount,
            window=data["window"],
            acting=acting,
            reason=_("Set on the usage pages"),
            **form.service_kwargs(),
        )
    except BudgetError as exc:
        return _refused(request, viewer, form, "budget_form", exc)
    return _done("budget_set", "lb-budgets")


def _preview(viewer: Viewer, form: BudgetForm) -> list[str]:
    """What the new limit means now: the user's spend against it ("has spent 4.20 of the new
    5.00 today"), for one user; the ceiling for the rest."""
    data = form.cleaned_data
    currency = conf.CURRENCY
    new = money_text(data["amount"], currency)
    window = str(data["window"])
    lines = []
    if data["kind"] == "end_user":
        who = data["who"].strip()
        user = EndUser.objects.filter(tenant=viewer.tenant, external_id=who).first()
        spent = Decimal(0)
        if user is not None:
            statuses = budget_statuses(viewer.tenant, user, timezone.now())
            spent = next(
                (
                    s.spent
                    for s in statuses
                    if s.window == window and s.scope in (Scope.END_USER, Scope.END_USER_DEFAULT)
                ),
                Decimal(0),
            )
        lines.append(
            _("%(who)s has spent %(spent)s of the new %(limit)s %(window)s.")
            % {
                "who": who,
                "spent": money_text(spent, currency),
                "limit": new,
                "window": _window_phrase(window),
            }
        )
        if spent >= data["amount"]:
            lines.append(_("Their next call will be refused until the window resets."))
    else:
        lines.append(
            _("The new limit: %(limit)s %(window)s.")
            % {"limit": new, "window": _window_phrase(window)}
        )
    room = self_serve_room(viewer.tenant, window)
    if room is not None:
        lines.append(
            _("The most your organisation may set: %(room)s.")
            % {"room": money_text(room, currency)}
        )
    return lines


def _window_phrase(window: str) -> str:
    phrases: dict[str, str] = {
        Window.DAY: _("today"),
        Window.MONTH: _("this billing month"),
        Window.HOUR: _("this hour"),
        Window.LIFETIME: _("in total"),
    }
    return phrases.get(window, window)


def budget_who(budget: Budget) -> str:
    """Whom a self-serve budget limits, in the viewer's language."""
    labels: dict[str, str] = {
        Scope.END_USER: _("User %(id)s"),
        Scope.END_USER_DEFAULT: _("Each user"),
        Scope.API_KEY: _("API key %(id)s"),
        Scope.API_KEY_DEFAULT: _("Each API key"),
        Scope.RUN: _("Run %(id)s"),
        Scope.RUN_DEFAULT: _("Each run"),
        Scope.TAG: _("Tag %(id)s"),
    }
    ids: dict[str, str] = {
        Scope.END_USER: budget.end_user.external_id if budget.end_user else "",
        Scope.API_KEY: budget.api_key.prefix if budget.api_key else "",
        Scope.RUN: budget.run.external_id if budget.run else "",
        Scope.TAG: f"{budget.tag_key}={budget.tag_value}",
    }
    return labels.get(budget.scope, budget.scope_label) % {"id": ids.get(budget.scope, "")}


def window_label(window: str) -> str:
    return str(dict(WINDOWS).get(window, window))  # type: ignore[call-overload]


def _label(budget: Budget) -> str:
    return (
        f"{budget_who(budget)}, {window_label(budget.window).lower()}: "
        f"{money_text(budget.limit, budget.currency)}"
    )


def _tenant_row(model: Any, pk: Any, viewer: Viewer, **lookup: Any) -> Any:
    """A row of the viewer's tenant named in the URL, else 404 (another tenant's looks absent)."""
    row = model.objects.filter(pk=pk, **lookup).first()
    if row is None:
        raise Http404(_("Nothing with this id in your organisation."))
    return row


@manage_page
def budget_remove_view(
    request: HttpRequest, viewer: Viewer, acting: TenantAdmin, pk: int
) -> HttpResponseBase:
    _allowed(viewer, "budgets")
    budget = _tenant_row(Budget, pk, viewer, tenant=viewer.tenant, scope__in=SELF_SERVE_SCOPES)
    return _destructive(
        request,
        viewer,
        title=_("Remove this budget?"),
        body=_("%(label)s will no longer apply; the default for each, if any, applies instead.")
        % {"label": _label(budget)},
        button=_("Remove the budget"),
        act=lambda: budget_remove(budget, acting=acting, reason=_("Removed on the usage pages")),
        done=("budget_removed", "lb-budgets"),
    )


# --- raises and resets --------------------------------------------------------------------


@manage_page
def raise_grant(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    form = _posted(request, viewer, "raises", RaiseForm, "raise_form")
    if isinstance(form, HttpResponse):
        return form
    data = form.cleaned_data
    budget = raise_target(viewer.tenant, data["user"], str(data["window"]))
    if budget is None:
        form.add_error(
            "user",
            _(
                "%(user)s has no budget of their own in this window to raise: set one first "
                "(Budgets above); a raise on the default would lift every user."
            )
            % {"user": data["user"]},
        )
        return _page(request, viewer, status=400, raise_form=form)
    try:
        budget_raise_grant(
            budget=budget,
            amount=data["amount"],
            until=timezone.now() + timedelta(hours=data["hours"]),
            reason=data["reason"],
            acting=acting,
        )
    except BudgetError as exc:
        return _refused(request, viewer, form, "raise_form", exc)
    return _done("raise_granted", "lb-raises")


@manage_page
def raise_revoke(
    request: HttpRequest, viewer: Viewer, acting: TenantAdmin, pk: int
) -> HttpResponseBase:
    _allowed(viewer, "raises")
    raise_ = _tenant_row(BudgetRaise, pk, viewer, budget__tenant=viewer.tenant)
    return _destructive(
        request,
        viewer,
        title=_("End this raise now?"),
        body=_("%(amount)s more on %(label)s ends now instead of at its time.")
        % {
            "amount": money_text(raise_.amount, raise_.budget.currency),
            "label": _label(raise_.budget),
        },
        button=_("End the raise"),
        act=lambda: budget_raise_revoke(
            raise_, acting=acting, reason=_("Ended on the usage pages")
        ),
        done=("raise_ended", "lb-raises"),
    )


@manage_page
def spend_reset(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    form = _posted(request, viewer, "reset_spend", ResetForm, "reset_form")
    if isinstance(form, HttpResponse):
        return form
    who = form.cleaned_data["user"]
    user = EndUser.objects.filter(tenant=viewer.tenant, external_id=who).first()
    if user is None:
        form.add_error("user", _("No user %(user)s has made calls here.") % {"user": who})
        return _page(request, viewer, status=400, reset_form=form)
    if request.POST.get("confirm") != "yes":
        return _confirm(
            request,
            viewer,
            title=_("Reset this user's spend?"),
            body=[
                _(
                    "%(user)s's spend this period goes back to zero on their own budgets; your "
                    "organisation's total keeps it (that money was spent)."
                )
                % {"user": who}
            ],
            fields={"user": who, "reason": form.cleaned_data["reason"]},
            button=_("Reset the spend"),
        )
    try:
        end_user_spend_reset(end_user=user, reason=form.cleaned_data["reason"], acting=acting)
    except BudgetError as exc:
        return _refused(request, viewer, form, "reset_form", exc)
    return _done("spend_reset", "lb-reset")


# --- API keys -----------------------------------------------------------------------------


@manage_page
def key_create(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    form = _posted(request, viewer, "api_keys", KeyForm, "key_form")
    if isinstance(form, HttpResponse):
        return form
    expires = form.cleaned_data["expires"]
    expires_at = None
    if expires is not None:
        zone = usage.billing_periods(viewer.tenant, timezone.now()).zone
        # The end of the chosen day in the tenant's timezone.
        expires_at = datetime.combine(expires + timedelta(days=1), datetime.min.time(), zone)
    try:
        key, secret = api_key_create(
            tenant=viewer.tenant.external_id,
            name=form.cleaned_data["name"],
            expires_at=expires_at,
            acting=acting,
        )
    except BudgetError as exc:
        return _refused(request, viewer, form, "key_form", exc)
    context = _context(request, viewer, "manage", key=key, secret=secret, back=_home("lb-keys"))
    return render(request, "llm_budgets/pages/secret.html", context)


@manage_page
def key_revoke(
    request: HttpRequest, viewer: Viewer, acting: TenantAdmin, pk: str
) -> HttpResponseBase:
    _allowed(viewer, "api_keys")
    key = _tenant_row(ApiKey, pk, viewer, tenant=viewer.tenant)
    return _destructive(
        request,
        viewer,
        title=_("Revoke this API key?"),
        body=_("%(name)s (%(prefix)s) stops working at once; this cannot be undone.")
        % {"name": key.name, "prefix": key.prefix},
        button=_("Revoke the key"),
        act=lambda: api_key_revoke(key, acting=acting, reason=_("Revoked on the usage pages")),
        done=("key_revoked", "lb-keys"),
    )


# --- alerts -------------------------------------------------------------------------------


@manage_page
def alert_subscribe(request: HttpRequest, viewer: Viewer, acting: TenantAdmin) -> HttpResponseBase:
    form = _posted(request, viewer, "alerts", AlertForm, "alert_form")
    if isinstance(form, HttpResponse):
        return form
    data = form.cleaned_data
    try:
        endpoint, secret = self_serve_subscribe(
            acting,
            kind=data["kind"],
            target=data["target"],
            event_types=data["event_types"],
            confirm_site=request.build_absolute_uri("/"),
        )
    except BudgetError as exc:
        return _refused(request, viewer, form, "alert_form", exc)
    if secret:
        context = _context(
            request, viewer, "manage", endpoint=endpoint, secret=secret, back=_home("lb-alerts")
        )
        return render(request, "llm_budgets/pages/secret.html", context)
    return _done("alerts_subscribed", "lb-alerts")


@manage_page
def alert_remove(
    request: HttpRequest, viewer: Viewer, acting: TenantAdmin, pk: int
) -> HttpResponseBase:
    _allowed(viewer, "alerts")
    try:
        endpoint = endpoint_get(pk, tenant=viewer.tenant)
    except EndpointNotFound:
        raise Http404(_("Nothing with this id in your organisation.")) from None
    return _destructive(
        request,
        viewer,
        title=_("Stop these alerts?"),
        body=_("Nothing more is sent to %(target)s.") % {"target": endpoint.target},
        button=_("Stop the alerts"),
        act=lambda: self_serve_unsubscribe(acting, endpoint),
        done=("alerts_stopped", "lb-alerts"),
    )
