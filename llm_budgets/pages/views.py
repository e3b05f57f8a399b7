"""The tenant pages: thin views that resolve who is looking (``access``), read (``figures``) and
render. Every page and the export see only ``viewer.tenant`` (and a member's own end user)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import date
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from llm_budgets.billing.totals import billed_so_far
from llm_budgets.conf import conf
from llm_budgets.control.self_serve import self_serve_enabled
from llm_budgets.money import money as money_text
from llm_budgets.pages import charts, export, figures
from llm_budgets.pages.access import (
    LoginRequired,
    TenantChoice,
    Viewer,
    may_view_any_tenant,
    viewer_for,
)
from llm_budgets.reads import usage
from llm_budgets.windows import Window

View = Callable[..., HttpResponseBase]


def private(view: Callable[..., HttpResponseBase]) -> View:
    """A page of one tenant's figures: never kept by a shared cache, nor by the browser for its
    back button after logout (``Cache-Control: private, no-store``)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        patch_cache_control(response, private=True, no_store=True)
        return response

    return wrapper


def tenant_page(view: Callable[..., HttpResponseBase]) -> View:
    """Resolve the viewer first: anonymous visitors go to the login page, anyone without a
    tenant gets 403 (``PermissionDenied``)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            viewer = viewer_for(request)
        except LoginRequired:
            return redirect_to_login(request.get_full_path())
        except TenantChoice:
            return _tenant_picker(request, request.path)
        return view(request, viewer, *args, **kwargs)

    return require_GET(private(wrapper))


def _context(request: HttpRequest, viewer: Viewer, section: str, **extra: Any) -> dict[str, Any]:
    tenant_query = "?" + urlencode({"tenant": viewer.tenant.external_id}) if viewer.staff else ""
    return {
        "viewer": viewer,
        "tenant": viewer.tenant,
        "tenant_name": viewer.tenant.name or viewer.tenant.external_id,
        "section": section,
        "currency": conf.CURRENCY,
        "tenant_query": tenant_query,
        "tenant_timezone": viewer.tenant.timezone,
        # The "Budgets" tab: a tenant admin's, where the operators turned self-serve on.
        "can_manage": not viewer.is_member
        and not viewer.staff
        and self_serve_enabled(viewer.tenant),
        **extra,
    }


@require_GET
@private
def tenants(request: HttpRequest) -> HttpResponseBase:
    """Support staff choose which tenant's pages to open (``?tenant=`` on every page)."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not may_view_any_tenant(request.user):
        raise PermissionDenied(_("Only support staff may choose a tenant."))
    return _tenant_picker(request, reverse("llm_budgets_pages:overview"))


def _tenant_picker(request: HttpRequest, target: str) -> HttpResponse:
    """The picker: each tenant links to ``target`` (the page asked for) with ``?tenant=``."""
    query = request.GET.get("q", "").strip()
    page = figures.tenants_to_pick(query, page=_page_number(request))
    context = {
        # Every key the other pages' frame reads, empty: a host base that shows the header or
        # the footer outside their blocks still renders here (docs/pages.md, template contract).
        "viewer": None,
        "tenant": None,
        "tenant_name": "",
        "tenant_query": "",
        "tenant_timezone": "",
        "currency": conf.CURRENCY,
        "section": "tenants",
        "page": page,
        "query": query,
        "target": target,
        "extra": f"&q={quote(query)}" if query else "",
    }
    return render(request, "llm_budgets/pages/tenants.html", context)


def _page_number(request: HttpRequest) -> int:
    try:
        return max(1, int(request.GET.get("page", "1")))
    except ValueError:
        return 1


@tenant_page
def overview(request: HttpRequest, viewer: Viewer) -> HttpResponse:
    now = timezone.now()
    data = figures.overview(viewer, now)
    periods = usage.billing_periods(viewer.tenant, now)
    unit = usage.amount_unit(viewer.tenant)
    context = _context(
        request,
        viewer,
        "overview",
        overview=data,
        period=periods.current,
        period_days=periods.days(periods.current),
        period_total=figures.period_total(viewer, periods, unit),
        # The projection of the budget the sentence is about: the organisation's monthly
        # budget, or a member's own (reads.projections).
        lead=next(
            (
                line.status
                for line in data.budgets
                if line.status.projected is not None and line.status.window == Window.MONTH
            ),
            None,
        ),
        # What Stripe accepted this period (llm_budgets.billing); tenant-wide, so not for a
        # member, and None for a tenant never billed through Stripe (docs/pages.md).
        billed=None
        if viewer.is_member or periods.current.end is None
        else billed_so_far(viewer.tenant, periods.current.start, periods.current.end),
    )
    return render(request, "llm_budgets/pages/overview.html", context)


@tenant_page
def models(request: HttpRequest, viewer: Viewer) -> HttpResponse:
    now = timezone.now()
    periods = usage.billing_periods(viewer.tenant, now)
    unit = usage.amount_unit(viewer.tenant)
    currency = conf.CURRENCY

    def money(value: Decimal) -> str:
        return money_text(value, currency)

    days = figures.spend_by_day(viewer, periods, unit)
    rows = figures.spend_by_model(viewer, periods, unit)
    budget = figures.period_budget(viewer, now, unit)
    today = (now.astimezone(periods.zone).date() - days[0].day).days if days else 0
    # Model names, largest first: the stacked chart's series (its legend's order).
    names = list(dict.fromkeys(r.short_label for r in rows))
    context = _context(
        request,
        viewer,
        "models",
        periods=periods,
        period_days=periods.days(periods.current),
        days=days,
        day_chart=charts.day_chart(days, money, lambda v: money_text(v, "")),
        budget=budget,
        day_rows=_running(days, today),
        run_chart=charts.run_chart(
            days,
            today,
            limit=budget.limit if budget else None,
            projected=budget.projected if budget else None,
            axis=lambda v: money_text(v, ""),
            money=money,
        ),
        rows=rows,
        stack_chart=charts.stack_chart(
            [d.day for d in days],
            figures.spend_by_day_and_model(viewer, periods, unit),
            names,
            other=_("Other models"),
            money=money,
            axis=lambda v: money_text(v, ""),
        ),
        total=sum((r.amount for r in rows), Decimal(0)),
        previous_total=sum((d.previous or Decimal(0) for d in days), Decimal(0)),
    )
    return render(request, "llm_budgets/pages/models.html", context)


def _running(days: list[figures.DayBar], today: int) -> list[tuple[figures.DayBar, Decimal | None]]:
    """Each day with the period's running total through it (None after today)."""
    total, rows = Decimal(0), []
    for index, day in enumerate(days):
        total += day.amount
        rows.append((day, total if index <= today else None))
    return rows


@tenant_page
def users(request: HttpRequest, viewer: Viewer) -> HttpResponse:
    now = timezone.now()
    periods = usage.billing_periods(viewer.tenant, now)
    unit = usage.amount_unit(viewer.tenant)
    currency = conf.CURRENCY
    sort = request.GET.get("sort", "amount")
    if sort not in usage.END_USER_SORTS:
        sort = "amount"
    page, top, total = figures.spend_by_end_user(
        viewer, periods, unit, sort=sort, page=_page_number(request)
    )
    context = _context(
        request,
        viewer,
        "users",
        periods=periods,
        period_days=periods.days(periods.current),
        page=page,
        sort=sort,
        sorts=[
            ("amount", _("Spend")),
            ("calls", _("Calls")),
            ("tokens", _("Output tokens")),
            ("name", _("Name")),
        ],
        row_chart=charts.row_chart(top, lambda v: money_text(v, currency)),
        row_chart_rows=top,  # a member's: their own row alone
        top_count=len(top),
        total=total,
    )
    return render(request, "llm_budgets/pages/users.html", context)


@tenant_page
def refusals(request: HttpRequest, viewer: Viewer) -> HttpResponse:
    page = figures.refusals(viewer, page=_page_number(request))
    return render(
        request, "llm_budgets/pages/refusals.html", _context(request, viewer, "refusals", page=page)
    )


def _bad_export(request: HttpRequest, viewer: Viewer, message: str) -> HttpResponse:
    """The export's form again (status 400), with the days entered and, beside them, what to
    change."""
    export_days = {"start": request.GET.get("start", ""), "end": request.GET.get("end", "")}
    context = _context(request, viewer, "overview", message=message, export=export_days)
    return render(request, "llm_budgets/pages/error.html", context, status=400)


def _day(request: HttpRequest, name: str) -> date | None:
    value = request.GET.get(name)
    if not value:
        return None
    return date.fromisoformat(value)


@tenant_page
def export_csv(request: HttpRequest, viewer: Viewer) -> HttpResponseBase:
    periods = usage.billing_periods(viewer.tenant, timezone.now())
    first, last = periods.days(periods.current)
    try:
        start = _day(request, "start") or first
        end = _day(request, "end") or last
    except ValueError:
        return _bad_export(
            request,
            viewer,
            _(
                "The first and last day must be dates written YYYY-MM-DD, "
                "e.g. ?start=2026-11-01&end=2026-11-30."
            ),
        )
    if end < start:
        return _bad_export(
            request,
            viewer,
            _(
                "The last day (%(end)s) is before the first (%(start)s): "
                "give the first and last day of the range."
            )
            % {"start": start.isoformat(), "end": end.isoformat()},
        )
    response = StreamingHttpResponse(
        export.csv_lines(export.ledger_rows(viewer, start, end)),
        content_type="text/csv; charset=utf-8",
    )
    name = f"usage-{viewer.tenant.external_id}-{start.isoformat()}-{end.isoformat()}.csv"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    response["Content-Disposition"] = f'attachment; filename="{safe}"'
    return response
