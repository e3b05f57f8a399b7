"""Stripe billing in the admin: links (written through the link services), deliveries (read-only,
parked ones retried by an action), reconciliation runs, webhook events (unprocessable and failed
ones reprocessed by an action)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from llm_budgets.admin.base import (
    AppAdmin,
    AppInline,
    ReadOnlyAdmin,
    ValuesFilter,
    actor,
    adopt,
    money_text,
    truncated,
    when_column,
)
from llm_budgets.billing.links import stripe_customer_link, stripe_customer_unlink
from llm_budgets.billing.stripe_push import delivery_retry
from llm_budgets.billing.totals import billing_status, unpaid_invoices
from llm_budgets.billing.webhook_shapes import body_text
from llm_budgets.billing.webhooks import webhook_reprocess
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    BillingLine,
    MeterDelivery,
    MeterDeliveryState,
    MeterErrorReport,
    ReconciliationDifference,
    ReconciliationRun,
    StripeCustomerLink,
    StripeInvoice,
    StripeMeter,
    StripePlanMeter,
    StripeWebhookEvent,
    Tenant,
    WebhookEventState,
)


class LinkForm(forms.ModelForm):
    class Meta:
        model = StripeCustomerLink
        fields = ["tenant", "customer_id"]

    def clean_customer_id(self) -> str:
        value = str(self.cleaned_data["customer_id"]).strip()
        if not value.startswith("cus_"):
            raise forms.ValidationError("A Stripe customer id starts with cus_ (e.g. cus_ABC123).")
        return value


@admin.register(StripeCustomerLink)
class StripeCustomerLinkAdmin(AppAdmin):
    """Link (or relink) a tenant here; unlink with the action. Both are audited."""

    form = LinkForm
    list_display = ["tenant", "customer_id", "active", "linked_at", "linked_by", "unlinked_at"]
    list_filter = ["unlinked_at"]
    search_fields = ["tenant__external_id", "customer_id"]
    readonly_fields = [
        "linked_at",
        "linked_by",
        "unlinked_at",
        "unlink_reason",
        "payment_switch",
        "unpaid_invoices",
    ]
    actions = ["unlink"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # Relink here by changing the customer id; the tenant is fixed once linked.
        fields = list(super().get_readonly_fields(request, obj))
        return ["tenant", *fields] if obj is not None else fields

    @admin.display(boolean=True, description="Active")
    def active(self, obj: StripeCustomerLink) -> bool:
        return obj.active

    @admin.display(description="Unpaid invoices the payment switch waits on")
    def unpaid_invoices(self, obj: StripeCustomerLink) -> str:
        return ", ".join(unpaid_invoices(obj.tenant_id)) or "-"

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # unlink instead: audited, and what is owed stays owed

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        saved = stripe_customer_link(
            tenant=obj.tenant, customer_id=obj.customer_id, actor=actor(request)
        )
        adopt(obj, saved)

    @admin.action(description="Unlink (stop delivering new usage; what is owed is still sent)")
    def unlink(self, request: HttpRequest, queryset: QuerySet[StripeCustomerLink]) -> None:
        done = 0
        for link in queryset.select_related("tenant"):
            try:
                stripe_customer_unlink(
                    tenant=link.tenant, reason="unlinked in the admin", actor=actor(request)
                )
                done += 1
            except InvalidUsage as exc:
                self.message_user(request, exc.message, messages.WARNING)
        self.message_user(request, f"Unlinked {done} tenant(s).")


@admin.register(StripePlanMeter)
class StripePlanMeterAdmin(AppAdmin):
    list_display = ["plan", "event_name"]


@admin.register(StripeMeter)
class StripeMeterAdmin(ReadOnlyAdmin):
    list_display = ["event_name", "meter_id", "price_id", "currency", "created_at"]


class LineInline(AppInline):
    model = BillingLine
    fields = ["usage_record", "kind", "amount", "currency", "occurred_at"]
    readonly_fields = ["usage_record", "kind", "amount", "currency", "occurred_at"]
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class ErrorReportInline(AppInline):
    """Meter errors Stripe reported later (webhook) for this delivery's identifier."""

    model = MeterErrorReport
    fields = ["created_at", "code", "message", "webhook_event"]
    readonly_fields = ["created_at", "code", "message", "webhook_event"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class EventNameFilter(ValuesFilter):
    title = "event name"
    parameter_name = "event_name"
    empty_label = "none"


@admin.register(MeterDelivery)
class MeterDeliveryAdmin(ReadOnlyAdmin):
    """What was (or will be) sent to Stripe. Parked rows carry Stripe's error and request id;
    fix the cause (e.g. relink the tenant to the right customer), then retry them."""

    list_display = [
        "hour_when",
        "tenant",
        "kind",
        "value",
        "state",
        "error_code",
        "sent_when",
    ]
    list_filter = ["state", "kind", EventNameFilter]
    search_fields = ["customer_id", "identifier", "tenant__external_id", "request_id"]
    date_hierarchy = "hour"
    inlines = [LineInline, ErrorReportInline]
    actions = ["retry"]

    hour_when = when_column("hour", "Hour")
    sent_when = when_column("sent_at", "Sent at")

    @admin.display(description="Value")
    def value(self, obj: MeterDelivery) -> str:
        return format_html("{} units ({})", obj.units, money_text(obj.amount, obj.currency))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("llm_budgets.retry_meterdelivery"))

    @admin.action(
        description="Retry parked deliveries (once the cause is fixed)", permissions=["retry"]
    )
    def retry(self, request: HttpRequest, queryset: QuerySet[MeterDelivery]) -> None:
        retried = sum(
            delivery_retry(delivery_id=d.pk, actor=actor(request))
            for d in queryset.filter(state=MeterDeliveryState.PARKED)
        )
        self.message_user(request, f"{retried} parked delivery(ies) will be sent on the next push.")


class DifferenceInline(AppInline):
    model = ReconciliationDifference
    fields = ["customer_id", "tenant", "event_name", "hour", "delivered_units", "stripe_units"]
    readonly_fields = [
        "customer_id",
        "tenant",
        "event_name",
        "hour",
        "delivered_units",
        "stripe_units",
    ]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(ReadOnlyAdmin):
    list_display = [
        "started_at",
        "window_start",
        "window_end",
        "customers",
        "hours_checked",
        "differences",
        "is_clean",
        "error",
    ]
    inlines = [DifferenceInline]

    @admin.display(boolean=True, description="Clean")
    def is_clean(self, obj: ReconciliationRun) -> bool:
        return obj.is_clean


@admin.register(StripeWebhookEvent)
class StripeWebhookEventAdmin(ReadOnlyAdmin):
    """Every event Stripe delivered, its body as received. *Unprocessable* ones were answered 200
    and not acted on (the error names the field); reprocess them once a release reads them."""

    # One "Result" column (the outcome, else the error) keeps the list within a laptop's width
    # with the sidebar open; attempts and processing time are on each event's page.
    list_display = ["id", "type", "state", "received_at", "result"]
    list_filter = ["state", "type", "processed_at"]
    search_fields = ["id", "type"]
    fields = readonly_fields = (
        "id",
        "type",
        "state",
        "received_at",
        "processed_at",
        "attempts",
        "outcome",
        "error",
        "body_text",
    )
    actions = ["reprocess"]

    @admin.display(description="Result")
    def result(self, obj: StripeWebhookEvent) -> str:
        return truncated(obj.error or obj.outcome, 40) or "-"

    @admin.display(description="Body (as received)")
    def body_text(self, obj: StripeWebhookEvent) -> str:
        return format_html(
            '<pre class="llmb-body" data-wire="stripe event body">{}</pre>',
            body_text(bytes(obj.body)),
        )

    def has_reprocess_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("llm_budgets.reprocess_stripewebhookevent"))

    @admin.action(
        description="Reprocess (unprocessable or failed events, read from their body again)",
        permissions=["reprocess"],
    )
    def reprocess(self, request: HttpRequest, queryset: QuerySet[StripeWebhookEvent]) -> None:
        states = Counter(
            webhook_reprocess(event_id=event.pk, actor=actor(request)).state
            for event in queryset.exclude(state=WebhookEventState.PROCESSED).only("pk")
        )
        self.message_user(
            request,
            f"Reprocessed {sum(states.values())} event(s): "
            f"{states[WebhookEventState.PROCESSED]} processed, "
            f"{states[WebhookEventState.UNPROCESSABLE]} still unprocessable, "
            f"{states[WebhookEventState.RECEIVED]} failed again (see each event's error).",
            messages.SUCCESS
            if states[WebhookEventState.PROCESSED] == sum(states.values())
            else messages.WARNING,
        )


@admin.register(StripeInvoice)
class StripeInvoiceAdmin(ReadOnlyAdmin):
    """Invoices a payment webhook named: unpaid ones hold the tenant's payment switch open."""

    list_display = ["invoice_id", "tenant", "payment_failed_at", "settled_at", "settled_as"]
    list_filter = ["settled_as"]
    search_fields = ["invoice_id", "tenant__external_id"]


@admin.register(MeterErrorReport)
class MeterErrorReportAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "code", "identifier", "delivery", "message"]


def billing_context(tenant: Tenant) -> dict[str, Any]:
    """The tenant page's Stripe panel: the link, what waits, what was sent, parked, too old."""
    status = billing_status(tenant)
    deliveries = reverse("admin:llm_budgets_meterdelivery_changelist")
    by_state = [
        {
            "state": MeterDeliveryState(state).label,
            "count": count,
            "amount": money_text(amount, conf.CURRENCY),
            "url": f"{deliveries}?"
            + urlencode({"tenant__id__exact": str(tenant.pk), "state__exact": str(state)}),
            "alert": state in (MeterDeliveryState.PARKED, MeterDeliveryState.TOO_OLD),
        }
        for state, (count, amount) in sorted(status.by_state.items())
    ]
    link = status.link
    return {
        "billing_link": link,
        "billing_unpaid_invoices": ", ".join(status.unpaid_invoices),
        "billing_link_url": (
            reverse("admin:llm_budgets_stripecustomerlink_change", args=[link.pk])
            if link
            else reverse("admin:llm_budgets_stripecustomerlink_add") + f"?tenant={tenant.pk}"
        ),
        "billing_unbuilt": (
            money_text(status.unbuilt_amount, conf.CURRENCY) if status.unbuilt_lines else None
        ),
        "billing_unbuilt_lines": status.unbuilt_lines,
        "billing_rows": by_state,
        "billing_reconciliation": status.last_reconciliation,
    }
