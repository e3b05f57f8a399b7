"""Prices: versioned, never edited. A new version is added through ``price_set`` (audited)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from llm_budgets.admin.base import actor, adopt, money_text
from llm_budgets.models import Price
from llm_budgets.pricing import price_set


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = [
            "provider",
            "model",
            "input_per_mtok",
            "cached_input_per_mtok",
            "cache_write_per_mtok",
            "output_per_mtok",
            "per_request",
            "effective_from",
            "source",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "effective_from" in self.fields:  # absent on the read-only view of a version
            self.fields["effective_from"].required = False
            self.fields["effective_from"].help_text = "Empty: from now."


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Every charge records the version it used, so a version is never changed or deleted:
    to correct a price, add a new version with a later ``effective_from``."""

    form = PriceForm
    list_display = [
        "provider",
        "model",
        "input_text",
        "output_text",
        "effective_from",
        "effective_to",
        "source",
    ]
    list_filter = ["provider", "source"]
    search_fields = ["provider", "model"]
    date_hierarchy = "effective_from"

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        saved = price_set(
            provider=obj.provider,
            model=obj.model,
            input_per_mtok=obj.input_per_mtok,
            output_per_mtok=obj.output_per_mtok,
            cached_input_per_mtok=obj.cached_input_per_mtok,
            cache_write_per_mtok=obj.cache_write_per_mtok,
            per_request=obj.per_request,
            effective_from=obj.effective_from,
            source=obj.source,
            actor=actor(request),
        )
        adopt(obj, saved)

    @admin.display(description="Input / Mtok", ordering="input_per_mtok")
    def input_text(self, obj: Price) -> str:
        return money_text(obj.input_per_mtok, obj.currency)

    @admin.display(description="Output / Mtok", ordering="output_per_mtok")
    def output_text(self, obj: Price) -> str:
        return money_text(obj.output_per_mtok, obj.currency)
