"""Prices: versioned, never edited. A new version is added through ``price_set`` (audited).

The list shows which version is current for each (provider, model) and filters current versions
from history; a version's page lists its history and links to a "new version" form prefilled
with its rates. ``UnpricedModelFilter`` finds reservations and ledger lines of models that have
no price in effect (admitted through the plan's unknown-model policy)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from llm_budgets.admin.base import AppAdmin, actor, adopt, rate_text, when_column, when_text
from llm_budgets.exceptions import InvalidUsage, UnknownPrice
from llm_budgets.models import ModelAlias, Price
from llm_budgets.pricing.costs import TOKEN_RATES
from llm_budgets.pricing.model_names import model_alias_delete, model_alias_set
from llm_budgets.pricing.prices import PRICE_FIELDS, current_versions, price_match, price_set


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = ["provider", "model", *PRICE_FIELDS, "effective_from", "source"]

    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why this version: recorded in the audit log.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "effective_from" in self.fields:  # absent on the read-only view of a version
            self.fields["effective_from"].required = False
            self.fields["effective_from"].help_text = "Empty: from now."


class VersionFilter(admin.SimpleListFilter):
    title = "version"
    parameter_name = "version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("current", "Current"), ("history", "History and future")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        current = current_versions(timezone.now())
        if self.value() == "current":
            return queryset.filter(pk__in=current)
        if self.value() == "history":
            return queryset.exclude(pk__in=current)
        return None


class UnpricedModelFilter(admin.SimpleListFilter):
    """On reservations and ledger lines: models in use that have no price in effect now, by the
    same resolution admission uses (``pricing.price_match``: the exact name, its spellings, the
    bundled catalogue's rules, admin aliases). So ``gpt-4o-2024-08-06`` priced through
    ``gpt-4o`` counts as priced."""

    title = "model priced now"
    parameter_name = "priced"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", "No: model without a price"), ("yes", "Yes")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() not in ("no", "yes"):
            return None
        # One query for the names in use (a few dozen at most), then each resolved in Python.
        now = timezone.now()
        priced = Q(pk__in=[])
        for provider, model in queryset.values_list("provider", "model").distinct().order_by():
            if _priced(provider, model, now):
                priced |= Q(provider=provider, model=model)
        return queryset.filter(priced) if self.value() == "yes" else queryset.exclude(priced)


def _priced(provider: str, model: str, at: datetime) -> bool:
    try:
        price_match(provider=provider or None, model=model, at=at)
    except UnknownPrice:
        return False
    return True


@admin.register(Price)
class PriceAdmin(AppAdmin):
    """Every charge records the version it used, so a version is never changed or deleted:
    to correct a price, add a new version with a later ``effective_from``."""

    form = PriceForm
    list_display = [
        "provider",
        "model",
        "input_text",
        "output_text",
        "effective_from_when",
        "is_current",
    ]
    list_filter = [VersionFilter, "provider", "source"]
    readonly_fields = ["history", "new_version"]
    search_fields = ["provider", "model"]
    date_hierarchy = "effective_from"

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if obj is None:  # the add form: no history yet, and the reason field
            return [f for f in fields if f not in ("history", "new_version")]
        # The read-only view: rates in the one money format with their unit, exact on hover.
        shown = {name: f"{name}_text" for name in _RATE_COLUMNS}
        return [shown.get(str(f), f) for f in fields if f != "reason"]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        if obj is None:
            return self.readonly_fields
        return [*self.readonly_fields, *(f"{name}_text" for name in _RATE_COLUMNS)]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """``?from_version=<id>`` prefills the form with that version's rates."""
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        wanted = request.GET.get("from_version", "")
        source = Price.objects.filter(pk=int(wanted)).first() if wanted.isdigit() else None
        if source is not None:
            for name in ("provider", "model", *PRICE_FIELDS):
                initial[name] = getattr(source, name)
        return initial

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        saved = price_set(
            provider=obj.provider,
            model=obj.model,
            effective_from=obj.effective_from,
            source=obj.source,
            actor=actor(request),
            reason=form.cleaned_data.get("reason", ""),
            **{name: getattr(obj, name) for name in PRICE_FIELDS},
        )
        adopt(obj, saved)

    @admin.display(description="Current", boolean=True)
    def is_current(self, obj: Price) -> bool:
        return obj.pk in self._current_ids

    def get_queryset(self, request: HttpRequest) -> QuerySet[Price]:
        # One query for the whole page's "current" column.
        self._current_ids = set(current_versions(timezone.now()).values_list("pk", flat=True))
        return super().get_queryset(request)

    @admin.display(description="Versions of this model")
    def history(self, obj: Price) -> str:
        current = set(current_versions(timezone.now()).values_list("pk", flat=True))
        versions = Price.objects.filter(provider=obj.provider, model=obj.model).order_by(
            "-effective_from"
        )
        rows = format_html_join(
            "",
            '<li><a href="{}">from {}</a>: input {}, output {} ({}){}</li>',
            (
                (
                    reverse("admin:llm_budgets_price_change", args=[v.pk]),
                    when_text(v.effective_from, None),
                    rate_text(v.input_per_mtok, v.currency),
                    rate_text(v.output_per_mtok, v.currency),
                    v.source,
                    " - current" if v.pk in current else "",
                )
                for v in versions
            ),
        )
        return format_html("<ul>{}</ul>", rows)

    @admin.display(description="New version")
    def new_version(self, obj: Price) -> str:
        url = reverse("admin:llm_budgets_price_add") + f"?from_version={obj.pk}"
        return format_html(
            '<a class="button" href="{}">Add a new version from these rates</a>', url
        )

    # The list names the unit once, in the header: each rate in a cell of its own width.
    @admin.display(description="Input / 1M tokens", ordering="input_per_mtok")
    def input_text(self, obj: Price) -> str:
        return rate_text(obj.input_per_mtok, obj.currency, unit="")

    @admin.display(description="Output / 1M tokens", ordering="output_per_mtok")
    def output_text(self, obj: Price) -> str:
        return rate_text(obj.output_per_mtok, obj.currency, unit="")

    effective_from_when = when_column("effective_from", "Effective from")
    effective_to_when = when_column("effective_to", "Until")


def _rate_column(name: str) -> Any:
    unit = "request" if name == "per_request" else "1M tokens"

    @admin.display(description=str(Price._meta.get_field(name).verbose_name).capitalize())  # type: ignore[union-attr]
    def column(self: Any, obj: Price) -> str:
        return rate_text(getattr(obj, name), obj.currency, unit)

    column.__name__ = f"{name}_text"
    return column


_RATE_COLUMNS = (*TOKEN_RATES, "per_request")
for _name in _RATE_COLUMNS:
    setattr(PriceAdmin, f"{_name}_text", _rate_column(_name))
del _name


class ModelAliasForm(forms.ModelForm):
    class Meta:
        model = ModelAlias
        fields = ["pattern", "provider", "model", "note"]

    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why: recorded in the audit log.",
    )

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if data.get("model") and data.get("pattern"):
            priced = Price.objects.filter(model=data["model"])
            if data.get("provider"):
                priced = priced.filter(provider=data["provider"])
            if not priced.exists():
                self.add_error("model", "This model has no price: add its price first.")
        return data


@admin.register(ModelAlias)
class ModelAliasAdmin(AppAdmin):
    """Names that neither an exact price nor genai-prices' rules recognise, pointed at a priced
    model. Tried last (docs/pricing.md, "Model names"); every change is audited."""

    form = ModelAliasForm
    list_display = ["pattern", "provider_text", "model", "note", "created_when"]
    list_filter = ["provider"]
    search_fields = ["pattern", "model", "note"]

    created_when = when_column("created_at", "Created")

    @admin.display(description="Provider", ordering="provider")
    def provider_text(self, obj: ModelAlias) -> str:
        return obj.provider or "any"

    def save_model(self, request: HttpRequest, obj: ModelAlias, form: Any, change: bool) -> None:
        try:
            saved = model_alias_set(
                pattern=obj.pattern,
                provider=obj.provider,
                model=obj.model,
                note=obj.note,
                actor=actor(request),
                reason=form.cleaned_data.get("reason", ""),
                alias=obj if change else None,
            )
        except InvalidUsage as invalid:
            # The form's clean checks the same first; a concurrent change lands here.
            raise ValidationError(invalid.message) from invalid
        adopt(obj, saved)

    def delete_model(self, request: HttpRequest, obj: ModelAlias) -> None:
        model_alias_delete(obj, actor=actor(request), reason="deleted in the admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ModelAlias]) -> None:
        for alias in queryset:
            model_alias_delete(alias, actor=actor(request), reason="deleted in the admin")
