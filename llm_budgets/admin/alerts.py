"""Alerts (docs/alerts.md): endpoints, the delivery log and the events.

Every change goes through :mod:`llm_budgets.alerts.endpoints`, which validates and audits it. A
webhook's signing secret is shown once, on a page of its own right after the create or the
rotation (never in a message: those travel in a cookie or the session), and never again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html
from django.utils.http import urlencode

from llm_budgets.admin.base import (
    AppAdmin,
    LinkStyles,
    ReadOnlyAdmin,
    actor,
    adopt,
    row_zone,
    truncated,
    when_column,
    when_text,
)
from llm_budgets.alerts.bodies import TYPES
from llm_budgets.alerts.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_disable,
    endpoint_enable,
    endpoint_get,
    endpoint_secret_rotate,
    endpoint_test_send,
    endpoint_update,
    event_types_validate,
    target_validate,
)
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    EndpointKind,
)

ACTION_PAGE = "admin/llm_budgets/control/action_form.html"
CHANGE_FORM = "admin/llm_budgets/alerts/change_form.html"
SECRET_PAGE = "admin/llm_budgets/alerts/secret_once.html"  # noqa: S105 (a template name)


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(f"llm_budgets.{permission}"):
        raise PermissionDenied


def _posted(request: HttpRequest) -> Any:
    """The form's data: a POST binds it even when empty (a confirmation has no fields)."""
    return request.POST if request.method == "POST" else None


def _owner(tenant: Any) -> str:
    return tenant.external_id if tenant is not None else "installation-wide"


def _endpoint_label(endpoint: AlertEndpoint) -> str:
    """``#5 webhook (acme)``: short enough for a list column."""
    return f"#{endpoint.pk} {endpoint.kind} ({_owner(endpoint.tenant)})"


def _endpoint_url(endpoint: AlertEndpoint) -> str:
    return reverse("admin:llm_budgets_alertendpoint_change", args=[endpoint.pk])


def _short_uid(uid: str) -> str:
    """An event or delivery id cut to 12 characters for a list (unique enough to tell rows
    apart), the whole id on hover and on its page."""
    return format_html('<span title="{}">{}</span>', uid, uid[:12])


def _secret_page(
    request: HttpRequest, endpoint: AlertEndpoint, secret: str, what: str
) -> TemplateResponse:
    response = TemplateResponse(
        request,
        SECRET_PAGE,
        {
            **admin.site.each_context(request),
            "title": f"Signing secret of endpoint {_endpoint_label(endpoint)}",
            "what": what,
            "secret": secret,
            "endpoint_url": _endpoint_url(endpoint),
            "endpoint_label": _endpoint_label(endpoint),
            "opts": AlertEndpoint._meta,
        },
    )
    add_never_cache_headers(response)  # the secret must stay in no cache
    return response


def _action_page(
    request: HttpRequest,
    endpoint: AlertEndpoint,
    *,
    title: str,
    form: forms.Form,
    explanation: str,
    submit_label: str,
    back: tuple[str, str] | None = None,
) -> TemplateResponse:
    """An action's own page; ``back``: (url, label) of where it came from (else the endpoint)."""
    back_url, back_label = back or (
        _endpoint_url(endpoint),
        f"Endpoint {_endpoint_label(endpoint)}",
    )
    return TemplateResponse(
        request,
        ACTION_PAGE,
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


class ObjectActionsMixin:
    """Buttons on an object's page for its actions (``object_actions``: url and label each),
    each leading to a page of its own. Set ``change_form_template = CHANGE_FORM``."""

    def object_actions(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        return []

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {
            **(extra_context or {}),
            "object_actions": self.object_actions(request, object_id),
        }
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc]


class EndpointForm(forms.ModelForm):
    event_types = forms.MultipleChoiceField(
        choices=[(name, name) for name in TYPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="The events it receives (docs/alerts.md says what each one means). A "
        "tenant's endpoint never receives the operators-only ones (stripe.delivery_parked).",
    )

    class Meta:
        model = AlertEndpoint
        fields = ["tenant", "kind", "target", "event_types", "description", "contact_emails"]
        widgets = {
            "target": forms.TextInput(attrs={"size": 60}),
            "contact_emails": forms.TextInput(attrs={"size": 60}),
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # The service's own checks, so a refusal is a form error beside its field.
        kind = self.instance.kind if self.instance.pk else data.get("kind")
        try:
            if kind and "target" in data:
                data["target"] = target_validate(str(kind), data["target"])
        except InvalidUsage as exc:
            self.add_error("target", exc.message)
        try:
            if "event_types" in data:
                owner = self.instance.tenant if self.instance.pk else data.get("tenant")
                data["event_types"] = event_types_validate(data["event_types"], tenant=owner)
        except InvalidUsage as exc:
            self.add_error("event_types", exc.message)
        return data


class RotateForm(forms.Form):
    overlap_seconds = forms.IntegerField(
        min_value=0,
        help_text="How long the old secret stays valid beside the new one (each delivery is "
        "signed with both meanwhile); 0: it stops at once. At most "
        "ALERTS_SECRET_OVERLAP_MAX_SECONDS (7 days by default).",
    )


class DisableForm(forms.Form):
    reason = forms.CharField(
        max_length=255,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Required. Why; kept in the audit log and shown in the endpoint list.",
    )


class ConfirmForm(forms.Form):
    pass


class DisableSelectedForm(DisableForm):
    action = forms.CharField(widget=forms.HiddenInput, initial="disable_selected")


@admin.register(AlertEndpoint)
class AlertEndpointAdmin(ObjectActionsMixin, AppAdmin):
    form = EndpointForm
    change_form_template = CHANGE_FORM
    list_display = ["short_target", "owner", "kind_value", "types", "state", "failures"]
    list_filter = ["kind", "enabled", ("tenant", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["target", "description", "tenant__external_id"]
    autocomplete_fields = ["tenant"]
    actions = ["send_test", "enable_selected", "disable_selected"]
    Media = LinkStyles

    READ_ONLY = [
        "owner",
        "kind",
        "secret_hint",
        "state_detail",
        "awaiting_confirmation",
        "consecutive_failures",
        "created_by",
        "created_when",
        "updated_when",
        "deliveries_link",
    ]

    created_when = when_column("created_at", "Created")
    updated_when = when_column("updated_at", "Changed")

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        if obj is None:
            return ["tenant", "kind", "target", "event_types", "description", "contact_emails"]
        return [
            "owner",
            "kind",
            "target",
            "event_types",
            "description",
            "contact_emails",
            "secret_hint",
            "state_detail",
            "awaiting_confirmation",
            "consecutive_failures",
            "deliveries_link",
            "created_by",
            "created_when",
            "updated_when",
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        # The owner and the kind are fixed at creation: another one is another endpoint.
        return [] if obj is None else self.READ_ONLY

    def save_model(self, request: HttpRequest, obj: AlertEndpoint, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            saved = endpoint_update(
                endpoint_get(obj.pk, tenant=None),
                target=data["target"],
                event_types=data["event_types"],
                description=data.get("description", ""),
                contact_emails=data.get("contact_emails", ""),
                actor=actor(request),
            )
        else:
            saved, secret = endpoint_create(
                tenant=data.get("tenant"),
                kind=data["kind"],
                target=data["target"],
                event_types=data["event_types"],
                description=data.get("description", ""),
                contact_emails=data.get("contact_emails", ""),
                actor=actor(request),
            )
            request._llmb_alert_secret = secret  # type: ignore[attr-defined]
        adopt(obj, saved)

    def response_add(
        self, request: HttpRequest, obj: AlertEndpoint, post_url_continue: str | None = None
    ) -> HttpResponse:
        secret = getattr(request, "_llmb_alert_secret", "")
        if secret:
            return _secret_page(request, obj, secret, "created")
        messages.success(request, f"Alert endpoint {_endpoint_label(obj)} created.")
        return HttpResponseRedirect(_endpoint_url(obj))

    def delete_model(self, request: HttpRequest, obj: AlertEndpoint) -> None:
        endpoint_delete(endpoint_get(obj.pk, tenant=None), actor=actor(request))

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # Its deliveries go with it (endpoint_delete): the delivery log's own read-only admin
        # must not make Django refuse the delete for want of a permission nobody has.
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AlertEndpoint]) -> None:
        for endpoint in queryset.select_related("tenant"):
            endpoint_delete(endpoint, actor=actor(request))

    # Columns.

    @admin.display(description="Target", ordering="target")
    def short_target(self, obj: AlertEndpoint) -> str:
        return truncated(obj.target, 36)

    @admin.display(description="Tenant", ordering="tenant__external_id")
    def owner(self, obj: AlertEndpoint) -> str:
        return _owner(obj.tenant)

    @admin.display(description="Kind", ordering="kind")
    def kind_value(self, obj: AlertEndpoint) -> str:
        return obj.kind  # the short value: the labels are long for a list column

    @admin.display(description="Event types")
    def types(self, obj: AlertEndpoint) -> str:
        chosen = list(obj.event_types or ())
        if set(chosen) >= set(TYPES):
            return f"all {len(TYPES)}"
        return truncated(", ".join(chosen), 40)

    @admin.display(description="Failures", ordering="consecutive_failures")
    def failures(self, obj: AlertEndpoint) -> int:
        """Failed attempts in a row (enough of them disable the endpoint)."""
        return obj.consecutive_failures

    @admin.display(description="State", ordering="enabled")
    def state(self, obj: AlertEndpoint) -> str:
        if obj.enabled:
            return "enabled"
        return truncated(f"disabled: {obj.disabled_reason or '?'}", 40)

    @admin.display(description="State")
    def state_detail(self, obj: AlertEndpoint) -> str:
        if obj.enabled:
            return "enabled"
        since = when_text(obj.disabled_at, row_zone(obj))
        return f"disabled {since}: {obj.disabled_reason or '?'}"

    @admin.display(description="Awaiting confirmation")
    def awaiting_confirmation(self, obj: AlertEndpoint) -> str:
        pending = sorted(obj.unconfirmed_emails or {})
        if not pending:
            return "-"
        return (
            f"{', '.join(pending)}: added by the tenant, each was emailed a link and receives "
            "nothing until it is followed"
        )

    @admin.display(description="Signing secret")
    def secret_hint(self, obj: AlertEndpoint) -> str:
        if obj.kind != EndpointKind.WEBHOOK:
            return "none (only webhooks are signed)"
        return f"ends in {obj.secret_hint} (shown once; rotate for a new one)"

    @admin.display(description="Deliveries")
    def deliveries_link(self, obj: AlertEndpoint) -> str:
        url = reverse("admin:llm_budgets_alertdelivery_changelist")
        query = urlencode({"endpoint__id__exact": obj.pk})
        return format_html('<a href="{}?{}">Its delivery log</a>', url, query)

    # The endpoint page's actions, each on a page of its own.

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:endpoint_id>/rotate-secret/",
                wrap(self.rotate_view),
                name="llm_budgets_alertendpoint_rotate",
            ),
            path(
                "<int:endpoint_id>/disable/",
                wrap(self.disable_view),
                name="llm_budgets_alertendpoint_disable",
            ),
            path(
                "<int:endpoint_id>/enable/",
                wrap(self.enable_view),
                name="llm_budgets_alertendpoint_enable",
            ),
            path(
                "<int:endpoint_id>/test/",
                wrap(self.test_view),
                name="llm_budgets_alertendpoint_test",
            ),
            *super().get_urls(),
        ]

    def object_actions(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        endpoint = (
            AlertEndpoint.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        )
        if endpoint is None or not request.user.has_perm("llm_budgets.change_alertendpoint"):
            return []
        links = [("test", "Send a test event")]
        if endpoint.kind == EndpointKind.WEBHOOK:
            links.append(("rotate", "Rotate the secret"))
        links.append(("disable", "Disable") if endpoint.enabled else ("enable", "Enable"))
        return [
            (reverse(f"admin:llm_budgets_alertendpoint_{name}", args=[endpoint.pk]), label)
            for name, label in links
        ]

    def _endpoint(self, request: HttpRequest, endpoint_id: int) -> AlertEndpoint:
        _require(request, "change_alertendpoint")
        return get_object_or_404(AlertEndpoint.objects.select_related("tenant"), pk=endpoint_id)

    def rotate_view(self, request: HttpRequest, endpoint_id: int) -> HttpResponse:
        endpoint = self._endpoint(request, endpoint_id)
        if endpoint.kind != EndpointKind.WEBHOOK:
            messages.error(request, "Only a webhook endpoint has a signing secret to rotate.")
            return HttpResponseRedirect(_endpoint_url(endpoint))
        form = RotateForm(
            _posted(request), initial={"overlap_seconds": conf.ALERTS_SECRET_OVERLAP_SECONDS}
        )
        if request.method == "POST" and form.is_valid():
            try:
                secret = endpoint_secret_rotate(
                    endpoint,
                    actor=actor(request),
                    overlap_seconds=form.cleaned_data["overlap_seconds"],
                )
            except InvalidUsage as exc:  # above ALERTS_SECRET_OVERLAP_MAX_SECONDS
                form.add_error("overlap_seconds", exc.message)
            else:
                return _secret_page(request, endpoint, secret, "rotated")
        return _action_page(
            request,
            endpoint,
            title=f"Rotate the signing secret of endpoint {_endpoint_label(endpoint)}",
            form=form,
            explanation=(
                f"A new secret replaces the one ending in {endpoint.secret_hint}. It is shown "
                "once, on the next page; give it to the receiver before the overlap ends."
            ),
            submit_label="Rotate the secret",
        )

    def _act(
        self,
        request: HttpRequest,
        endpoint_id: int,
        form_class: type[forms.Form],
        act: Callable[[AlertEndpoint, dict[str, Any]], str],
        *,
        title: str,
        explanation: str,
        submit_label: str,
    ) -> HttpResponse:
        """An endpoint action on a page of its own: the form, then ``act(endpoint, data)`` (a
        service call) whose message is shown on the endpoint's page."""
        endpoint = self._endpoint(request, endpoint_id)
        form = form_class(_posted(request))
        if request.method == "POST" and form.is_valid():
            try:
                messages.success(request, act(endpoint, form.cleaned_data))
            except InvalidUsage as exc:  # e.g. enabling an email endpoint nobody confirmed
                messages.error(request, exc.message)
            return HttpResponseRedirect(_endpoint_url(endpoint))
        label = _endpoint_label(endpoint)
        return _action_page(
            request,
            endpoint,
            title=f"{title} {label}",
            form=form,
            explanation=explanation.format(reason=endpoint.disabled_reason or "?"),
            submit_label=submit_label,
        )

    def disable_view(self, request: HttpRequest, endpoint_id: int) -> HttpResponse:
        def act(endpoint: AlertEndpoint, data: dict[str, Any]) -> str:
            endpoint_disable(endpoint, reason=data["reason"], actor=actor(request))
            return (
                f"Endpoint {_endpoint_label(endpoint)} disabled: its deliveries wait until it "
                "is enabled again."
            )

        return self._act(
            request,
            endpoint_id,
            DisableForm,
            act,
            title="Disable endpoint",
            explanation="Nothing is sent to it while it is disabled; its events keep queueing "
            "and go out in order once it is enabled.",
            submit_label="Disable this endpoint",
        )

    def enable_view(self, request: HttpRequest, endpoint_id: int) -> HttpResponse:
        def act(endpoint: AlertEndpoint, data: dict[str, Any]) -> str:
            endpoint_enable(endpoint, actor=actor(request))
            return f"Endpoint {_endpoint_label(endpoint)} enabled."

        return self._act(
            request,
            endpoint_id,
            ConfirmForm,
            act,
            title="Enable endpoint",
            explanation="Disabled: {reason}. Enabling sends its waiting deliveries, oldest "
            "first, and starts its failure count over.",
            submit_label="Enable this endpoint",
        )

    def test_view(self, request: HttpRequest, endpoint_id: int) -> HttpResponse:
        def act(endpoint: AlertEndpoint, data: dict[str, Any]) -> str:
            return _test_queued(endpoint, endpoint_test_send(endpoint, actor=actor(request)))

        return self._act(
            request,
            endpoint_id,
            ConfirmForm,
            act,
            title="Send a test event to endpoint",
            explanation="Queues an alert.test event for this endpoint alone; the delivery job "
            "sends it like any other (to a disabled endpoint once it is enabled).",
            submit_label="Send a test event",
        )

    # List actions.

    def has_manage_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("llm_budgets.change_alertendpoint")

    @admin.action(description="Send a test event to the selected endpoints", permissions=["manage"])
    def send_test(self, request: HttpRequest, queryset: QuerySet[AlertEndpoint]) -> None:
        for endpoint in queryset.select_related("tenant"):
            event = endpoint_test_send(endpoint, actor=actor(request))
            messages.success(request, _test_queued(endpoint, event))

    @admin.action(description="Enable the selected endpoints", permissions=["manage"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[AlertEndpoint]) -> None:
        count, waiting = 0, []
        for endpoint in queryset.filter(enabled=False).select_related("tenant"):
            try:
                endpoint_enable(endpoint, actor=actor(request))
            except InvalidUsage:  # an email endpoint none of whose addresses confirmed
                waiting.append(_endpoint_label(endpoint))
                continue
            count += 1
        messages.success(request, f"Enabled {count} endpoint(s).")
        if waiting:
            messages.warning(
                request,
                f"Not enabled: {', '.join(waiting)}: no address has confirmed yet (each was "
                "sent a link).",
            )

    @admin.action(description="Disable the selected endpoints…", permissions=["manage"])
    def disable_selected(
        self, request: HttpRequest, queryset: QuerySet[AlertEndpoint]
    ) -> HttpResponse | None:
        form = DisableSelectedForm(request.POST if "reason" in request.POST else None)
        if form.is_bound and form.is_valid():
            count = 0
            for endpoint in queryset.filter(enabled=True).select_related("tenant"):
                endpoint_disable(endpoint, reason=form.cleaned_data["reason"], actor=actor(request))
                count += 1
            messages.success(request, f"Disabled {count} endpoint(s).")
            return None
        return TemplateResponse(
            request,
            "admin/llm_budgets/alerts/disable_selected.html",
            {
                **self.admin_site.each_context(request),
                "title": "Disable alert endpoints",
                "form": form,
                "endpoints": [_endpoint_label(e) for e in queryset.select_related("tenant")],
                "selected": queryset.values_list("pk", flat=True),
                "checkbox_name": ACTION_CHECKBOX_NAME,
                "opts": self.model._meta,
            },
        )


def _test_queued(endpoint: AlertEndpoint, event: AlertEvent) -> str:
    later = "" if endpoint.enabled else " (it goes out once the endpoint is enabled)"
    return f"Test event {event.uid} queued for endpoint {_endpoint_label(endpoint)}{later}."


class DeliveryStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(AlertDeliveryState.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(state=self.value()) if self.value() else queryset


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ObjectActionsMixin, ReadOnlyAdmin):
    """The delivery log: one row per event and endpoint, written by the alerts package only."""

    change_form_template = CHANGE_FORM

    # The delivery id is on its page (and searchable): a list column of it would not fit.
    list_display = [
        "event_type",
        "endpoint_link",
        "state_value",
        "attempts_text",
        "error_text",
        "next_attempt",
    ]
    list_display_links = ["event_type"]
    list_filter = [DeliveryStateFilter, "event__type", "endpoint__kind"]
    list_select_related = ["event", "endpoint__tenant"]
    search_fields = ["uid", "event__uid", "event__type", "endpoint__target"]
    actions = ["redeliver"]
    fields = readonly_fields = (
        "delivery_id",
        "event_link",
        "event_type",
        "endpoint_link",
        "state",
        "attempts",
        "last_status_code",
        "last_error",
        "next_attempt",
        "first_attempt",
        "last_attempt",
        "delivered",
        "created",
    )

    @admin.display(description="Delivery id")
    def delivery_id(self, obj: AlertDelivery) -> str:
        return obj.uid

    @admin.display(description="Event type", ordering="event__type")
    def event_type(self, obj: AlertDelivery) -> str:
        return obj.event.type

    @admin.display(description="Endpoint")
    def endpoint_link(self, obj: AlertDelivery) -> str:
        return format_html(
            '<a href="{}">{}</a>', _endpoint_url(obj.endpoint), _endpoint_label(obj.endpoint)
        )

    @admin.display(description="Event")
    def event_link(self, obj: AlertDelivery) -> str:
        url = reverse("admin:llm_budgets_alertevent_change", args=[obj.event_id])
        return format_html('<a href="{}">{}</a>', url, obj.event.uid)

    @admin.display(description="State", ordering="state")
    def state_value(self, obj: AlertDelivery) -> str:
        return obj.state  # the short value: the labels explain it in the filter

    @admin.display(description="Attempts", ordering="attempts")
    def attempts_text(self, obj: AlertDelivery) -> str:
        if obj.last_status_code is None:
            return str(obj.attempts)
        return f"{obj.attempts} (HTTP {obj.last_status_code})"

    @admin.display(description="Last error")
    def error_text(self, obj: AlertDelivery) -> str:
        # Errors are often one long word (an exception's repr): short, so the table fits.
        return truncated(obj.last_error, 26) if obj.last_error else "-"

    @admin.display(description="Next attempt", ordering="next_attempt_at")
    def next_attempt(self, obj: AlertDelivery) -> str:
        if obj.state != AlertDeliveryState.PENDING:
            return "-"
        return when_text(obj.next_attempt_at, row_zone(obj))

    @admin.display(description="First attempt")
    def first_attempt(self, obj: AlertDelivery) -> str:
        return when_text(obj.first_attempt_at, row_zone(obj), seconds=True)

    @admin.display(description="Last attempt")
    def last_attempt(self, obj: AlertDelivery) -> str:
        return when_text(obj.last_attempt_at, row_zone(obj), seconds=True)

    @admin.display(description="Delivered")
    def delivered(self, obj: AlertDelivery) -> str:
        return when_text(obj.delivered_at, row_zone(obj), seconds=True)

    @admin.display(description="Created")
    def created(self, obj: AlertDelivery) -> str:
        return when_text(obj.created_at, row_zone(obj), seconds=True)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:delivery_id>/redeliver/",
                self.admin_site.admin_view(self.redeliver_view),
                name="llm_budgets_alertdelivery_redeliver",
            ),
            *super().get_urls(),
        ]

    def object_actions(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        if not object_id.isdigit() or not self.has_redeliver_permission(request):
            return []
        url = reverse("admin:llm_budgets_alertdelivery_redeliver", args=[int(object_id)])
        return [(url, "Redeliver")]

    def redeliver_view(self, request: HttpRequest, delivery_id: int) -> HttpResponse:
        _require(request, "change_alertdelivery")
        delivery = get_object_or_404(
            AlertDelivery.objects.select_related("event", "endpoint__tenant"), pk=delivery_id
        )
        page = reverse("admin:llm_budgets_alertdelivery_change", args=[delivery.pk])
        form = ConfirmForm(_posted(request))
        if request.method == "POST" and form.is_valid():
            delivery_redeliver(delivery, actor=actor(request))
            messages.success(request, f"Delivery {delivery.uid} queued again, due now.")
            return HttpResponseRedirect(page)
        return _action_page(
            request,
            delivery.endpoint,
            title=f"Redeliver {delivery.uid}",
            form=form,
            explanation=(
                f"Sends the {delivery.event.type} event to endpoint "
                f"{_endpoint_label(delivery.endpoint)} again, with the same delivery id (a "
                f"receiver that stored it can tell); now {delivery.state} after "
                f"{delivery.attempts} attempt(s)."
            ),
            submit_label="Redeliver",
            back=(page, f"Delivery {delivery.uid}"),
        )

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("llm_budgets.change_alertdelivery")

    @admin.action(
        description="Redeliver the selected deliveries (same delivery id, due now)",
        permissions=["redeliver"],
    )
    def redeliver(self, request: HttpRequest, queryset: QuerySet[AlertDelivery]) -> None:
        count = 0
        for delivery in queryset.select_related("event", "endpoint"):
            delivery_redeliver(delivery, actor=actor(request))
            count += 1
        messages.success(
            request,
            f"{count} delivery(ies) queued again, due now; receivers recognise a copy they "
            "stored by its delivery id.",
        )


@admin.register(AlertEvent)
class AlertEventAdmin(ReadOnlyAdmin):
    list_display = ["event", "type", "owner", "created_when"]
    list_filter = ["type", ("tenant", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["uid", "type", "tenant__external_id"]
    fields = readonly_fields = (
        "event_id",
        "type",
        "version",
        "owner",
        "created_when",
        "body_json",
        "deliveries_link",
    )

    created_when = when_column("created_at", "Created", seconds=True)

    @admin.display(description="Event", ordering="pk")
    def event(self, obj: AlertEvent) -> str:
        return _short_uid(obj.uid)

    @admin.display(description="Event id")
    def event_id(self, obj: AlertEvent) -> str:
        return obj.uid

    @admin.display(description="Tenant", ordering="tenant__external_id")
    def owner(self, obj: AlertEvent) -> str:
        return _owner(obj.tenant)

    @admin.display(description="Body")
    def body_json(self, obj: AlertEvent) -> str:
        # The body as receivers get it (ISO times, exact amounts): the wire format, not a figure
        # for people, so the one-format rule does not apply inside it.
        return format_html(
            '<pre data-wire="alert body">{}</pre>', json.dumps(obj.body, indent=2, sort_keys=True)
        )

    @admin.display(description="Deliveries")
    def deliveries_link(self, obj: AlertEvent) -> str:
        url = reverse("admin:llm_budgets_alertdelivery_changelist")
        query = urlencode({"event__id__exact": obj.pk})
        return format_html('<a href="{}?{}">Its deliveries</a>', url, query)
