"""The tenant's prepaid balance page: where it stands, its history (top-ups, grants, expiries,
refunds) and, for the tenant's admins, a "Top up" form that starts a Stripe Checkout session.
Thin: ``billing/credits.py`` and ``billing/topups.py`` do the work."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from llm_budgets.billing.credits import account_of, balance_state
from llm_budgets.billing.topups import packages, top_up_checkout
from llm_budgets.exceptions import InvalidUsage, NoBalance, PaymentProviderError
from llm_budgets.models import CreditLot, TopUp
from llm_budgets.pages.access import LoginRequired, TenantChoice, Viewer, viewer_for
from llm_budgets.pages.views import _context, private, tenant_page

HISTORY = 50


def _may_top_up(viewer: Viewer) -> bool:
    """A tenant's admin: not a member (who sees one end user), not support staff."""
    return not viewer.is_member and not viewer.staff


def _page(request: HttpRequest, viewer: Viewer, error: str = "", status: int = 200) -> HttpResponse:
    if viewer.is_member:
        raise PermissionDenied(_("The balance is shown to the organisation's admins."))
    try:
        account = account_of(viewer.tenant)
    except NoBalance:
        account = None
    extra: dict[str, Any] = {"account": account, "error": error}
    if account is not None:
        extra.update(
            state=balance_state(account),
            lots=CreditLot.objects.filter(account=account).order_by("-created_at", "-pk")[:HISTORY],
            top_ups=TopUp.objects.filter(account=account).order_by("-created_at", "-pk")[:HISTORY],
            packages=sorted(packages().items()),
            may_top_up=_may_top_up(viewer),
        )
    return render(
        request,
        "llm_budgets/pages/balance.html",
        _context(request, viewer, "balance", **extra),
        status=status,
    )


@tenant_page
def balance(request: HttpRequest, viewer: Viewer) -> HttpResponse:
    return _page(request, viewer)


@require_POST
@private
def top_up(request: HttpRequest) -> HttpResponseBase:
    """The "Top up" form: a Checkout session, then off to Stripe (tenant admins only)."""
    try:
        viewer = viewer_for(request)
    except (LoginRequired, TenantChoice):
        return redirect_to_login(reverse("llm_budgets_pages:balance"))
    if not _may_top_up(viewer):
        raise PermissionDenied(_("Only the organisation's admins may top up its balance."))
    here = request.build_absolute_uri(reverse("llm_budgets_pages:balance"))
    package = request.POST.get("package") or None
    try:
        started = top_up_checkout(
            tenant=viewer.tenant.external_id,
            amount=None if package else request.POST.get("amount", "").strip() or None,
            package=package,
            success_url=here + "?paid=1",
            cancel_url=here,
            actor=str(request.user.get_username()),
        )
    except InvalidUsage as exc:
        return _page(request, viewer, error=exc.message, status=400)
    except PaymentProviderError as exc:  # Stripe's fault, not the form's: the page says retry
        page = _page(request, viewer, error=exc.message, status=503)
        page["Retry-After"] = str(exc.retry_after)
        return page
    return HttpResponseRedirect(started.url)
