"""Pieces every admin module shares: the read-only mixin, money text, the acting user."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.money import display


def money_text(amount: Decimal | None, currency: str) -> str:
    """An amount as support staff read it: ``30.00 USD``; exact, never a float."""
    if amount is None:
        return "-"
    return f"{display(amount)} {currency}"


def clean_identifier(field: str, value: object) -> str:
    """An id typed into an admin form, in its canonical form (``validation.identifier``), or the
    same refusal the API gives, as a form error."""
    try:
        return validation.identifier(field, value)
    except InvalidUsage as exc:
        raise forms.ValidationError(exc.message) from None


def actor(request: HttpRequest) -> str:
    """Who acted, for the audit log."""
    return request.user.get_username()


def adopt(obj: Model, saved: Model) -> None:
    """Turn the admin's unsaved ``obj`` into the row a service saved (for its log, redirect)."""
    for field in saved._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding = False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable, never written here: the services own these rows."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
