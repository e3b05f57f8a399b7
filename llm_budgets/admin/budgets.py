"""Budgets (limits change only through ``budget_set_limit``, audited) and their counters."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db.models import Model, Sum
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from llm_budgets import money
from llm_budgets.admin.base import (
    AppAdmin,
    ReadOnlyAdmin,
    actor,
    adopt,
    end_user_link,
    limit_text,
    money_text,
    row_zone,
    when_column,
    when_text,
)
from llm_budgets.control.limits import ALL_END_USERS, api_key_of, budget_set_limit, tag_pair
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import Budget, Counter, Scope
from llm_budgets.money import display, round_charge
from llm_budgets.reads.overviews import active_raises, budget_list_statuses
from llm_budgets.tenancy.runs import run_validate

# Which owner each scope needs: (tenant, end user). The rest name an API key, a run or a tag of
# a tenant (``_NAMED``).
_OWNERS = {
    Scope.GLOBAL: (False, False),
    Scope.TENANT: (True, False),
    Scope.END_USER_DEFAULT: (True, False),
    Scope.END_USER: (True, True),
}
# The fields each API key, run or tag scope needs, beyond its tenant.
_NAMED: dict[str, tuple[str, ...]] = {
    Scope.API_KEY_DEFAULT: (),
    Scope.API_KEY: ("api_key_prefix",),
    Scope.RUN_DEFAULT: (),
    Scope.RUN: ("run_id",),
    Scope.TAG: ("tag_key", "tag_value"),
}
_NAMED_FIELDS = ("api_key_prefix", "run_id", "tag_key", "tag_value")


class BudgetForm(forms.ModelForm):
    api_key_prefix = forms.CharField(
        required=False,
        label="API key",
        help_text="For “One API key”: the key's prefix (the part before the dot).",
    )
    run_id = forms.CharField(
        required=False,
        label="Run",
        help_text="For “One run”: the run's id as the host names it (created if new).",
    )
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Why the limit changes; kept in the audit log.",
    )

    class Meta:
        model = Budget
        fields = [
            "scope",
            "tenant",
            "end_user",
            "tag_key",
            "tag_value",
            "window",
            "limit",
            "hot",
            "stripes",
        ]
        help_texts = {
            "tag_key": "For “Tag”: the tag's name, e.g. project.",
            "tag_value": "For “Tag”: its value, e.g. alpha: every call tagged project=alpha.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "limit" not in self.fields:
            return  # the read-only view
        self.fields["limit"].validators.append(MinValueValidator(0))
        if "stripes" in self.fields:
            self.fields["stripes"].required = False  # blank: as it is (8 for a new budget)
        if self.instance.pk is not None:
            self.initial["limit"] = display(self.instance.limit)  # 45.00, not 45.0000000000

    def clean_stripes(self) -> int:
        stripes = self.cleaned_data.get("stripes")
        return self.instance.stripes if stripes is None else stripes

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "scope" not in self.fields or not data.get("scope"):
            return data  # a change: scope and owner are fixed
        end_user = data.get("end_user")
        if end_user is not None and data.get("tenant") is None:
            data["tenant"] = end_user.tenant
        scope = Scope(data["scope"])
        if scope in _NAMED:
            return self._clean_named(scope, data)
        given = [str(self.fields[name].label) for name in _NAMED_FIELDS if data.get(name)]
        if given:
            raise ValidationError(f"Scope “{scope.label}” takes no {' or '.join(given)}.")
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
        self._refuse_existing(
            Budget.objects.filter(scope=scope, window=data.get("window"), **owner)
        )
        return data

    def _clean_named(self, scope: Scope, data: dict[str, Any]) -> dict[str, Any]:
        """An API key, run or tag budget: its tenant and what it names, checked the way
        ``budget_set_limit`` checks them (the same errors, on the field)."""
        if data.get("tenant") is None:
            raise ValidationError(f"Scope “{scope.label}” needs a tenant.")
        if data.get("end_user") is not None:
            raise ValidationError(f"Scope “{scope.label}” takes no end user.")
        needed = _NAMED[scope]
        for name in _NAMED_FIELDS:
            value = (data.get(name) or "").strip()
            data[name] = value
            label = self.fields[name].label
            if name in needed and not value:
                self.add_error(name, f"Scope “{scope.label}” needs the {label}.")
            elif name not in needed and value:
                self.add_error(name, f"Scope “{scope.label}” takes no {label}.")
        if self.errors:
            return data
        tenant = data["tenant"]
        try:
            if scope == Scope.TAG:
                pair = (data["tag_key"], data["tag_value"])
                data["tag_key"], data["tag_value"] = tag_pair(pair, field="tag_key")
            elif scope == Scope.RUN:
                data["run_id"] = run_validate(data["run_id"], field="run_id")
            elif scope == Scope.API_KEY:
                data["api_key"] = api_key_of(tenant, data["api_key_prefix"], field="api_key_prefix")
        except InvalidUsage as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
            return data
        existing = Budget.objects.filter(scope=scope, window=data.get("window"), tenant=tenant)
        if scope == Scope.TAG:
            existing = existing.filter(tag_key=data["tag_key"], tag_value=data["tag_value"])
        elif scope == Scope.RUN:
            existing = existing.filter(run__external_id=data["run_id"])
        elif scope == Scope.API_KEY:
            existing = existing.filter(api_key=data["api_key"])
        self._refuse_existing(existing)
        return data

    @staticmethod
    def _refuse_existing(existing: Any) -> None:
        if existing.exists():
            raise ValidationError(
                "This budget already exists: open it from the list and change its limit."
            )


@admin.register(Budget)
class BudgetAdmin(AppAdmin):
    """Adding a budget or changing its limit calls ``budget_set_limit``, which audits it. The
    list shows where each budget stands this period (the numbers admission uses)."""

    form = BudgetForm
    list_display = [
        "budget",
        "window",
        "limit_now",
        "spent_now",
        "remaining_now",
        "resets_now",
        "created_when",
    ]
    list_display_links = ["budget"]
    list_filter = ["scope", "window"]
    list_select_related = ["tenant", "end_user"]
    search_fields = ["tenant__external_id", "tenant__name", "end_user__external_id"]
    date_hierarchy = "updated_at"
    autocomplete_fields = ["tenant", "end_user"]
    fixed_on_change = ["scope", "budget", "tenant", "end_user", "window"]

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[Any]:
        if obj is None:
            return [
                "scope",
                "tenant",
                "end_user",
                *_NAMED_FIELDS,
                "window",
                "limit",
                "hot",
                "stripes",
                "reason",
            ]
        return [*self.fixed_on_change, "limit", "hot", "stripes", "reason", *self.shown_on_change]

    shown_on_change = ["currency", "this_period", "counts_from", "recent_periods"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        if obj is None:
            return []
        return [*self.fixed_on_change, *self.shown_on_change]

    def annotate_page(self, request: HttpRequest, rows: list[Budget]) -> None:
        now = timezone.now()
        statuses = budget_list_statuses(rows, now)
        raises = active_raises([b.pk for b in rows], now)
        for budget in rows:
            budget.status_now = statuses.get(budget.pk)  # type: ignore[attr-defined]
            budget.raises_now = raises.get(budget.pk, [])  # type: ignore[attr-defined]

    created_when = when_column("created_at", "Counts from")

    @admin.display(description="Limit now", ordering="limit")
    def limit_now(self, obj: Budget) -> str:
        raises = getattr(obj, "raises_now", [])
        total = obj.limit + sum((r.amount for r in raises), Decimal(0))
        return limit_text(total, raises, obj.currency, row_zone(obj))

    @admin.display(description="Spent now")
    def spent_now(self, obj: Budget) -> str:
        status = getattr(obj, "status_now", None)
        if status is None:
            return "per end user"
        if not status.reserved:
            return money_text(status.spent, obj.currency)
        return format_html(
            "{} <small>(+ {} held)</small>",
            money_text(status.spent, obj.currency),
            money_text(status.reserved, obj.currency),
        )

    @admin.display(description="Remaining")
    def remaining_now(self, obj: Budget) -> str:
        status = getattr(obj, "status_now", None)
        return "per end user" if status is None else money_text(status.remaining, obj.currency)

    @admin.display(description="Resets")
    def resets_now(self, obj: Budget) -> str:
        status = getattr(obj, "status_now", None)
        if status is None or status.resets_at is None:
            return "-" if status is None else "never"
        return when_text(status.resets_at, row_zone(obj))

    @admin.display(description="This period")
    def this_period(self, obj: Budget) -> str:
        now = timezone.now()
        status = budget_list_statuses([obj], now).get(obj.pk)
        if status is None:
            return "Each end user has a counter of its own: see the end user's page."
        raises = active_raises([obj.pk], now).get(obj.pk, [])
        zone = row_zone(obj)
        return format_html(
            "limit {}; spent {}, reserved {}, remaining {}; from {} to {}",
            limit_text(status.limit, raises, obj.currency, zone),
            money_text(status.spent, obj.currency),
            money_text(status.reserved, obj.currency),
            money_text(status.remaining, obj.currency),
            when_text(status.period_start, zone),
            when_text(status.resets_at, zone) if status.resets_at else "never (lifetime)",
        )

    @admin.display(description="Counts from")
    def counts_from(self, obj: Budget) -> str:
        zone = row_zone(obj)
        return format_html(
            "{}. A budget is not retroactive: spend before it was created is not counted in it, "
            "even within the period it was created in.",
            when_text(obj.created_at, zone),
        )

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # Removing a cap silently widens spending; set a new limit instead.
        return False

    def save_model(self, request: HttpRequest, obj: Budget, form: Any, change: bool) -> None:
        before = Budget.objects.filter(pk=obj.pk).values_list("limit", flat=True).first()
        saved = budget_set_limit(
            amount=obj.limit,
            window=obj.window,
            tenant=obj.tenant.external_id if obj.tenant else None,
            end_user=_end_user_argument(obj),
            **_named_scope_arguments(obj, form.cleaned_data if not change else {}),
            hot=obj.hot,
            stripes=obj.stripes,
            actor=actor(request),
            reason=form.cleaned_data.get("reason", ""),
        )
        adopt(obj, saved)
        limit = money.money(saved.limit, saved.currency)
        if before is None:
            what = f"{budget_phrase(saved)} created with a limit of {limit}"
        else:
            was = money.money(before, saved.currency)
            what = f"Limit of {budget_phrase(saved)} set to {limit} (was {was})"
        request._llmb_message = f"{what[0].upper()}{what[1:]}."  # type: ignore[attr-defined]

    def message_user(
        self,
        request: HttpRequest,
        message: Any,
        level: int | str = messages.INFO,
        extra_tags: str = "",
        fail_silently: bool = False,
    ) -> None:
        # The service's outcome in words, instead of "The budget ... was changed successfully".
        message = getattr(request, "_llmb_message", message)
        super().message_user(request, message, level, extra_tags, fail_silently)

    @admin.display(description="Budget", ordering="scope")
    def budget(self, obj: Budget) -> str:
        return obj.scope_label

    @admin.display(description="Recent periods")
    def recent_periods(self, obj: Budget) -> str:
        # A hot budget's stripes summed: one line per period (and end user of a "*" budget).
        counters = list(
            obj.counters.values("period_start", "end_user__external_id")
            .annotate(spent=Sum("spent"), reserved=Sum("reserved"))
            .order_by("-period_start", "end_user__external_id")[:5]
        )
        if not counters:
            return "No request has used this budget yet."
        return format_html_join(
            "",
            "<div>from {}: spent {}, reserved {}{}</div>",
            (
                (
                    when_text(c["period_start"], row_zone(obj)),
                    money_text(round_charge(Decimal(str(c["spent"]))), obj.currency),
                    money_text(round_charge(Decimal(str(c["reserved"]))), obj.currency),
                    f" (end user {who})" if (who := c["end_user__external_id"]) else "",
                )
                for c in counters
            ),
        )


def budget_phrase(budget: Budget) -> str:
    """``tenant acme's month budget``, ``the global day budget``."""
    if budget.scope == Scope.GLOBAL:
        return f"the global {budget.window} budget"
    return f"{budget.scope_label}'s {budget.window} budget"


def _end_user_argument(budget: Budget) -> str | None:
    if budget.scope == Scope.END_USER_DEFAULT:
        return ALL_END_USERS
    if budget.scope == Scope.END_USER and budget.end_user is not None:
        return budget.end_user.external_id
    return None


def _named_scope_arguments(budget: Budget, added: dict[str, Any]) -> dict[str, Any]:
    """The API key, run or tag a budget of those scopes names, as ``budget_set_limit`` takes it
    (without it a limit change would land on the tenant's budget). ``added``: the add form's
    cleaned data (the run is named there: the budget has no run row yet)."""
    if budget.scope == Scope.API_KEY_DEFAULT or budget.scope == Scope.RUN_DEFAULT:
        return {"api_key" if budget.scope == Scope.API_KEY_DEFAULT else "run": "*"}
    if budget.scope == Scope.RUN and added.get("run_id"):
        return {"run": added["run_id"]}
    if budget.scope == Scope.API_KEY and added.get("api_key") is not None:
        return {"api_key": added["api_key"].prefix}
    if budget.scope == Scope.API_KEY and budget.api_key is not None:
        return {"api_key": budget.api_key.prefix}
    if budget.scope == Scope.RUN and budget.run is not None:
        return {"run": budget.run.external_id}
    if budget.scope == Scope.TAG:
        return {"tag": (budget.tag_key, budget.tag_value)}
    return {}


@admin.register(Counter)
class CounterAdmin(ReadOnlyAdmin):
    """Spent and reserved per budget and period: written only by admission and settlement."""

    list_display = [
        "budget_label",
        "end_user_label",
        "window",
        "period_when",
        "stripe_text",
        "spent_text",
        "reserved_text",
    ]
    list_filter = ["budget__scope", "budget__window"]
    list_select_related = ["budget__tenant", "budget__end_user", "end_user"]
    search_fields = [
        "budget__tenant__external_id",
        "budget__end_user__external_id",
        "end_user__external_id",
    ]
    date_hierarchy = "period_start"
    fields = readonly_fields = (
        "budget",
        "end_user_label",
        "period_when",
        "stripe_text",
        "spent_text",
        "reserved_text",
    )

    period_when = when_column("period_start", "Period from")

    @admin.display(description="End user", ordering="end_user__external_id")
    def end_user_label(self, obj: Counter) -> str:
        """Whose counter: an each-end-user (``*``) budget keeps one per end user."""
        return end_user_link(obj.end_user or obj.budget.end_user)

    @admin.display(description="Budget", ordering="budget__scope")
    def budget_label(self, obj: Counter) -> str:
        return obj.budget.scope_label

    @admin.display(description="Window", ordering="budget__window")
    def window(self, obj: Counter) -> str:
        return obj.budget.window

    @admin.display(description="Stripe", ordering="stripe")
    def stripe_text(self, obj: Counter) -> str:
        """A hot budget's counter is split into stripes; its budget's page shows their sum."""
        if obj.allowance is None:
            return "-" if not obj.stripe else str(obj.stripe)
        allowance = money_text(obj.allowance, obj.budget.currency)
        return f"{obj.stripe} (may admit up to {allowance} alone)"

    @admin.display(description="Spent", ordering="spent")
    def spent_text(self, obj: Counter) -> str:
        return money_text(obj.spent, obj.budget.currency)

    @admin.display(description="Reserved", ordering="reserved")
    def reserved_text(self, obj: Counter) -> str:
        return money_text(obj.reserved, obj.budget.currency)
