"""Prepaid balances in the admin: each balance with its credit, lots and top-ups (read-only), and
an "Adjust balance" page (permission "Can change credit account") that calls
``billing.credits.balance_adjust``, audited with the reason given."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from llm_budgets.admin.base import ReadOnlyAdmin, ReadOnlyInline, actor, money_text
from llm_budgets.admin.control import _form_page, _require
from llm_budgets.billing.credits import balance_adjust, balance_state, recharge_set
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import CreditAccount, CreditLot, LotKind, TopUp


class LotInline(ReadOnlyInline):
    model = CreditLot
    readonly_fields = [
        "kind",
        "source",
        "amount",
        "forfeited",
        "taken_back",
        "expires_at",
        "expired_at",
        "reason",
    ]
    fields = list(readonly_fields)
    show_change_link = False


class TopUpInline(ReadOnlyInline):
    model = TopUp
    readonly_fields = [
        "kind",
        "state",
        "amount",
        "refunded",
        "disputed",
        "dispute_status",
        "unrecovered",
        "payment_intent_id",
        "error",
    ]
    fields = list(readonly_fields)
    show_change_link = False


class AdjustForm(forms.Form):
    direction = forms.ChoiceField(choices=[("add", "Add credit"), ("remove", "Remove credit")])
    amount = forms.DecimalField(min_value=0, max_digits=20, decimal_places=10)
    kind = forms.ChoiceField(choices=LotKind.choices, initial=LotKind.PROMOTIONAL)
    expires_at = forms.DateTimeField(required=False, help_text="Added credit only; optional.")
    reason = forms.CharField(widget=forms.Textarea, help_text="Recorded in the audit log.")


class RechargeForm(forms.Form):
    below = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=20,
        decimal_places=10,
        help_text="Charge when the balance falls below this. Empty: auto-recharge off.",
    )
    amount = forms.DecimalField(required=False, min_value=0, max_digits=20, decimal_places=2)
    daily_max = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=20,
        decimal_places=2,
        help_text="At most this much recharged per UTC day (default: one recharge).",
    )
    reason = forms.CharField(widget=forms.Textarea, help_text="Recorded in the audit log.")


@admin.register(CreditAccount)
class CreditAccountAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "credit", "available", "recharge", "currency"]
    search_fields = ["tenant__external_id", "tenant__name"]
    list_select_related = ["tenant", "budget"]
    readonly_fields = ["tenant", "currency", "top_up_url", "figures", "recharge", "adjust"]
    fields = list(readonly_fields)
    inlines = [LotInline, TopUpInline]

    @admin.display(description="Credit")
    def credit(self, obj: CreditAccount) -> Any:
        return money_text(obj.budget.limit, obj.currency)

    @admin.display(description="Available")
    def available(self, obj: CreditAccount) -> Any:
        return money_text(balance_state(obj).available, obj.currency)

    @admin.display(description="Credit, spent, held, available, debt")
    def figures(self, obj: CreditAccount) -> Any:
        state = balance_state(obj)
        return format_html(
            "{} credit, {} spent, {} held, {} available, {} debt",
            money_text(state.credit, obj.currency),
            money_text(state.spent, obj.currency),
            money_text(state.held, obj.currency),
            money_text(state.available, obj.currency),
            money_text(state.debt, obj.currency),
        )

    @admin.display(description="Auto-recharge")
    def recharge(self, obj: CreditAccount) -> str:
        if obj.recharge_below is None:
            return "off"
        return (
            f"below {obj.recharge_below.normalize()} charge {obj.recharge_amount}, at most "
            f"{obj.recharge_daily_max} a day ({'armed' if obj.recharge_armed else 'waiting'})"
        )

    @admin.display(description="Adjust")
    def adjust(self, obj: CreditAccount) -> Any:
        return format_html(
            '<a href="{}">Adjust balance</a> · <a href="{}">Auto-recharge</a>',
            reverse("admin:llm_budgets_creditaccount_adjust", args=[obj.pk]),
            reverse("admin:llm_budgets_creditaccount_recharge", args=[obj.pk]),
        )

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:account_id>/adjust/",
                self.admin_site.admin_view(self.adjust_view),
                name="llm_budgets_creditaccount_adjust",
            ),
            path(
                "<int:account_id>/recharge/",
                self.admin_site.admin_view(self.recharge_view),
                name="llm_budgets_creditaccount_recharge",
            ),
            *super().get_urls(),
        ]

    def recharge_view(self, request: HttpRequest, account_id: int) -> HttpResponse:
        _require(request, "change_creditaccount")
        account = get_object_or_404(CreditAccount.objects.select_related("tenant"), pk=account_id)
        page = reverse("admin:llm_budgets_creditaccount_change", args=[account.pk])
        initial = {
            "below": account.recharge_below,
            "amount": account.recharge_amount,
            "daily_max": account.recharge_daily_max,
        }
        form = RechargeForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                recharge_set(
                    tenant=account.tenant.external_id,
                    below=data["below"],
                    amount=data["amount"],
                    daily_max=data["daily_max"],
                    actor=actor(request),
                    reason=data["reason"],
                )
            except InvalidUsage as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                messages.success(request, f"Auto-recharge of {account.tenant.external_id} saved.")
                return HttpResponseRedirect(page)
        return _form_page(
            request,
            title=f"Auto-recharge of {account.tenant.external_id}",
            form=form,
            explanation="When the balance falls below the threshold, the amount is charged to the "
            "card saved at the tenant's last Checkout, off-session, at most the daily maximum a "
            "day. Audited.",
            back_url=page,
            back_label="Back to the balance",
            submit_label="Save",
        )

    def adjust_view(self, request: HttpRequest, account_id: int) -> HttpResponse:
        _require(request, "change_creditaccount")
        account = get_object_or_404(CreditAccount.objects.select_related("tenant"), pk=account_id)
        page = reverse("admin:llm_budgets_creditaccount_change", args=[account.pk])
        form = AdjustForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                credit = balance_adjust(
                    tenant=account.tenant.external_id,
                    amount=data["amount"],
                    direction=data["direction"],
                    kind=data["kind"],
                    expires_at=data["expires_at"] if data["direction"] == "add" else None,
                    actor=actor(request),
                    reason=data["reason"],
                )
            except InvalidUsage as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                messages.success(
                    request, f"Balance of {account.tenant.external_id}: credit now {credit}."
                )
                return HttpResponseRedirect(page)
        return _form_page(
            request,
            title=f"Adjust the balance of {account.tenant.external_id}",
            form=form,
            explanation="Adds a lot of credit, or removes credit that is neither spent nor held. "
            "Audited. Stripe's credit grants are not changed: see the reconciliation.",
            back_url=page,
            back_label="Back to the balance",
            submit_label="Adjust",
        )
