"""Pieces every admin module shares: the read-only mixin, money and time text, the acting user."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from types import MethodType
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Model
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import capfirst

from llm_budgets import clock, money, validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES


def money_text(amount: Decimal | None, currency: str) -> SafeString | str:
    """An amount as support staff read it (``9,998.65 USD``), the exact stored value on hover.
    HTML: for plain text (messages, explanations) use :func:`llm_budgets.money.money`."""
    return money.money_html(amount, currency)


def rate_text(amount: Decimal | None, currency: str, unit: str = "1M tokens") -> SafeString | str:
    """A price per unit with its unit (``0.80 USD / 1M tokens``), the exact rate on hover."""
    return money.rate_html(amount, currency, unit)


def when_text(at: datetime | None, tz_name: str | None, *, seconds: bool = False) -> str:
    """A time in the tenant's timezone, labelled (``Tue 1 Dec 2026 12:10 CET``)."""
    return clock.when(at, tz_name, seconds=seconds)


def staff_zone() -> str:
    """The zone of the person reading: the active timezone (``TIME_ZONE`` unless the host
    activates a per-user one)."""
    return timezone.get_current_timezone_name()


def row_zone(obj: Any) -> str | None:
    """The zone one row's times are shown in (the one rule, docs/support.md): in a list, which
    spans tenants, the staff user's; on the row's own page, its tenant's."""
    return staff_zone() if getattr(obj, LIST_ROW, False) else tenant_zone(obj)


# Set on the rows a changelist shows (``AppAdmin``), so a column knows it is in a list.
LIST_ROW = "_llmb_list_row"


def tenant_zone(obj: Any) -> str | None:
    """The timezone of the tenant a row belongs to (``obj.tenant``, or its budget's, end user's
    or alert endpoint's), None (the site's own) for rows without a tenant."""
    if isinstance(obj, Tenant):
        return str(obj.timezone)
    for path in (("tenant",), ("budget", "tenant"), ("end_user", "tenant"), ("endpoint", "tenant")):
        value = obj
        for name in path:
            value = getattr(value, name, None)
            if value is None:
                break
        if value is not None:
            return str(value.timezone)
    return None


def when_column(field: str, description: str, *, seconds: bool = False) -> Any:
    """A list/detail column showing the datetime ``field``: in a list in the staff user's zone,
    on the row's page in its tenant's (``row_zone``)."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return when_text(getattr(obj, field), row_zone(obj), seconds=seconds)

    column.__name__ = f"{field}_when"
    return column


def day_column(field: str, description: str) -> Any:
    """A list/detail column showing the date ``field`` in the one format (``Sun 25 Oct 2026``)."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return clock.day(getattr(obj, field))

    column.__name__ = f"{field}_day"
    return column


def amount_column(field: str, description: str) -> Any:
    """A list/detail column showing the amount ``field`` in the one money format, in the row's
    ``currency`` (the site's when the row has none), exact on hover."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> SafeString | str:
        return money_text(getattr(obj, field), getattr(obj, "currency", "") or conf.CURRENCY)

    column.__name__ = f"{field}_money"
    return column


def percent_column(field: str, description: str) -> Any:
    """A list/detail column showing the percentage ``field`` as ``12.5%`` (not ``12.500``)."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        value = getattr(obj, field)
        return "-" if value is None else f"{money.display(value).removesuffix('.00')}%"

    column.__name__ = f"{field}_percent"
    return column


class OneFormat:
    """Times, dates and money in the one format on every page, without naming each column: a
    ``DateTimeField`` (or ``DateField``, or an amount or percentage ``DecimalField``) shown
    read-only or in a list is swapped for a column written by ``clock`` or ``money``
    (``when_column``: the zone rule, labelled). Fields a form edits are left to their widgets."""

    model: type[Model]

    def _shown(self, name: Any) -> Any:
        if not isinstance(name, str):
            return name
        try:
            field = self.model._meta.get_field(name)
        except FieldDoesNotExist:
            return name
        make: Callable[[str, str], Any]
        if isinstance(field, models.DateTimeField):
            make, shown = when_column, f"{name}_when"
        elif isinstance(field, models.DateField):
            make, shown = day_column, f"{name}_day"
        elif isinstance(field, models.DecimalField) and name.endswith("_percent"):
            make, shown = percent_column, f"{name}_shown"
        elif isinstance(field, models.DecimalField) and field.decimal_places == DECIMAL_PLACES:
            make, shown = amount_column, f"{name}_money"
        else:
            return name
        if not hasattr(self, shown):
            column = make(name, capfirst(str(field.verbose_name)))
            setattr(self, shown, MethodType(column, self))
        return shown

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        fields = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        return [self._shown(f) for f in fields]

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        view_only = obj is not None and not self.has_change_permission(request, obj)  # type: ignore[attr-defined]
        declared = set(self.readonly_fields)  # type: ignore[attr-defined]
        return [
            f if self._edited(f) and not view_only and f not in declared else self._shown(f)
            for f in fields
        ]

    def _edited(self, name: Any) -> bool:
        """Whether a form may edit field ``name`` (a read-only one, or no field, is shown)."""
        try:
            return bool(self.model._meta.get_field(name).editable)
        except (FieldDoesNotExist, TypeError):
            return False


def end_user_url(end_user: EndUser | None) -> str:
    """The end user's admin page ("" for none)."""
    if end_user is None:
        return ""
    return reverse("admin:llm_budgets_enduser_change", args=[end_user.pk])


def end_user_link(end_user: EndUser | None) -> str:
    """The end user's external id, linked to their page (``-`` for none)."""
    if end_user is None:
        return "-"
    return format_html('<a href="{}">{}</a>', end_user_url(end_user), end_user.external_id)


def truncated(text: str, length: int = 60) -> str:
    """Long text cut for a list, the whole of it on hover (and on the detail page)."""
    if len(text) <= length:
        return text
    return format_html('<span title="{}">{}&hellip;</span>', text, text[: length - 1])


def short_id(value: object) -> str:
    """A UUID shortened for lists (the first 8 characters); the detail page shows all of it."""
    text = str(value)
    return text[:8] if len(text) == 36 else text


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


class LinkStyles:
    """The app's admin stylesheet (``llm_budgets/admin.css``: links in running text underlined)."""

    css = {"all": ["llm_budgets/admin.css"]}


class _AppChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The page's rows, fetched once (the queryset caches them for the template).
        rows = list(self.result_list)
        for row in rows:
            setattr(row, LIST_ROW, True)
        self.model_admin.annotate_page(request, rows)  # type: ignore[attr-defined]


class AppAdmin(OneFormat, admin.ModelAdmin):
    """Every ModelAdmin of the app: its stylesheet, list rows marked for the zone rule
    (``row_zone``), and ``annotate_page`` for columns that need a few queries for the whole page
    rather than one per row."""

    Media = LinkStyles

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _AppChangeList

    def annotate_page(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach what the page's columns show to ``rows`` (its list rows)."""

    def get_list_display(self, request: HttpRequest) -> Any:
        return [self._shown(f) for f in super().get_list_display(request)]

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        # A list of changes by staff: the staff user's zone (templates/admin/llm_budgets/).
        context = {"staff_zone": staff_zone(), **(extra_context or {})}
        return super().history_view(request, object_id, extra_context=context)


class AppInline(OneFormat, admin.TabularInline):
    """Every inline of the app: times in the one format (``OneFormat``)."""


class ReadOnlyAdmin(AppAdmin):
    """Viewable, never written here: the services own these rows."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class ReadOnlyInline(AppInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


def limit_text(
    limit: Decimal, raises: list[Any], currency: str, tz_name: str | None
) -> SafeString | str:
    """A limit in force with the temporary raises it includes, as a person reads it:
    ``75.00 USD, of which 25.00 USD until Fri 5 Dec 2026 18:00 CET``. ``limit`` includes them."""
    if not raises:
        return money_text(limit, currency)
    parts = format_html_join(
        "; ",
        "{} until {}",
        ((money_text(r.amount, currency), when_text(r.ends_at, tz_name)) for r in raises),
    )
    return format_html(
        '{}<span class="llmb-sep">, </span><span class="llmb-raise">of which {}</span>',
        money_text(limit, currency),
        parts,
    )


class ValuesFilter(admin.SimpleListFilter):
    """A list filter on a text field's values that names the empty value (Django's own filter
    offers it as a link without text, which no screen reader can name). Subclass with
    ``parameter_name`` (the field), ``title`` and ``empty_label``."""

    empty_label = "none"
    EMPTY = "__none__"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        field = str(self.parameter_name)
        values = (
            model_admin.get_queryset(request)
            .exclude(**{field: ""})
            .order_by(field)
            .values_list(field, flat=True)
            .distinct()
        )
        return [(self.EMPTY, self.empty_label), *((v, v) for v in values)]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value is None:
            return queryset
        field = str(self.parameter_name)
        return queryset.filter(**{field: "" if value == self.EMPTY else value})
