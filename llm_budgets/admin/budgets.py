"""Budgets (limits change only through ``budget_set_limit``, audited) and their counters."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db.models import Model
from django.http import HttpRequest
from django.utils.html import format_html_join

from llm_budgets.admin.base import ReadOnlyAdmin, actor, adopt, money_text
from llm_budgets.limits import ALL_END_USERS, budget_set_limit
from llm_budgets.models import Budget, Counter, Scope
from llm_budgets.money import display

# Which owner each scope needs: (tenant, end user).
_OWNERS = {
    Scope.GLOBAL: (False, False),
    Scope.TENANT: (True, False),
    Scope.END_USER_DEFAULT: (True, False),
    Scope.END_USER: (True, True),
}


class BudgetForm(forms.ModelForm):
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Why the limit changes; kept in the audit log.",
    )

    class Meta:
        model = Budget
        fields = ["scope", "tenant", "end_user", "window", "limit"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "limit" not in self.fields:
            return  # the read-only view
        self.fields["limit"].validators.append(MinValueValidator(0))
        if self.instance.pk is not None:
            self.initial["limit"] = display(self.instance.limit)  # 45.00, not 45.0000000000

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "scope" not in self.fields or not data.get("scope"):
            return data  # a change: scope and owner are fixed
        end_user = data.get("end_user")
        if end_user is not None and data.get("tenant") is None:
            data["tenant"] = end_user.tenant
        scope = Scope(data["scope"])
        needs_tenant, needs_user = _OWNERS[scope]
        if needs_tenant != (data.get("tenant") is not None):
            verb = "needs a" if needs_tenant else "takes no"
            raise ValidationError(f"Scope “{scope.label}” {verb} tenant.")
        if needs_user != (end_user is not None):
            verb = "needs an" if needs_user else "takes no"
            raise ValidationError(f"Scope “{scope.label}” {verb} end user.")
        if end_user is not None and end_user.tenant_id != data["tenant"].pk:
            raise ValidationError("The end user belongs to another tenant.")
        owner = {"tenant": data.get("tenant"), "end_user": end_user}
        if Budget.objects.filter(scope=data["scope"], window=data.get("window"), **owner).exists():
            raise ValidationError(
                "This budget already exists: open it from the list and change its limit."
            )
        return data


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """Adding a budget or changing its limit calls ``budget_set_limit``, which audits it."""

    form = BudgetForm
    list_display = ["budget", "window", "limit_text", "tenant", "end_user", "updated_at"]
    list_filter = ["scope", "window"]
    list_select_related = ["tenant", "end_user"]
    search_fields = ["tenant__external_id", "tenant__name", "end_user__external_id"]
    date_hierarchy = "updated_at"
    autocomplete_fields = ["tenant", "end_user"]
    fixed_on_change = ["scope", "tenant", "end_user", "window"]

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return ["scope", "tenant", "end_user", "window", "limit", "reason"]
        return [*self.fixed_on_change, "limit", "reason", "currency", "recent_periods"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        if obj is None:
            return []
        return [*self.fixed_on_change, "currency", "recent_periods"]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Removing a cap silently widens spending; set a new limit instead.
        return False

    def save_model(self, request: HttpRequest, obj: Budget, form: Any, change: bool) -> None:
        saved = budget_set_limit(
            amount=obj.limit,
            window=obj.window,
            tenant=obj.tenant.external_id if obj.tenant else None,
            end_user=_end_user_argument(obj),
            actor=actor(request),
            reason=form.cleaned_data.get("reason", ""),
        )
        adopt(obj, saved)

    @admin.display(description="Budget", ordering="scope")
    def budget(self, obj: Budget) -> str:
        return obj.scope_label

    @admin.display(description="Limit", ordering="limit")
    def limit_text(self, obj: Budget) -> str:
        return money_text(obj.limit, obj.currency)

    @admin.display(description="Recent periods")
    def recent_periods(self, obj: Budget) -> str:
        counters = obj.counters.order_by("-period_start")[:5]
        if not counters:
            return "No request has used this budget yet."
        return format_html_join(
            "",
            "<div>{}: spent {}, reserved {}</div>",
            (
                (
                    f"{c.period_start:%Y-%m-%d %H:%M} UTC",
                    money_text(c.spent, obj.currency),
                    money_text(c.reserved, obj.currency),
                )
                for c in counters
            ),
        )


def _end_user_argument(budget: Budget) -> str | None:
    if budget.scope == Scope.END_USER_DEFAULT:
        return ALL_END_USERS
    if budget.scope == Scope.END_USER and budget.end_user is not None:
        return budget.end_user.external_id
    return None


@admin.register(Counter)
class CounterAdmin(ReadOnlyAdmin):
    """Spent and reserved per budget and period: written only by admission and settlement."""

    list_display = ["budget_label", "window", "period_start", "spent_text", "reserved_text"]
    list_filter = ["budget__scope", "budget__window"]
    list_select_related = ["budget__tenant", "budget__end_user"]
    search_fields = ["budget__tenant__external_id", "budget__end_user__external_id"]
    date_hierarchy = "period_start"
    fields = readonly_fields = ("budget", "period_start", "spent_text", "reserved_text")

    @admin.display(description="Budget", ordering="budget__scope")
    def budget_label(self, obj: Counter) -> str:
        return obj.budget.scope_label

    @admin.display(description="Window", ordering="budget__window")
    def window(self, obj: Counter) -> str:
        return obj.budget.window

    @admin.display(description="Spent", ordering="spent")
    def spent_text(self, obj: Counter) -> str:
        return money_text(obj.spent, obj.budget.currency)

    @admin.display(description="Reserved", ordering="reserved")
    def reserved_text(self, obj: Counter) -> str:
        return money_text(obj.reserved, obj.budget.currency)
