"""The page a confirmation link opens (docs/alerts.md, "Email addresses a tenant adds are
confirmed first"): GET shows what would be confirmed and a button, POST confirms. A GET never
confirms: mail scanners and link previews fetch links nobody clicked.

No login and no CSRF token: the signed link is the credential, and the page acts only on the
address it names. Thin: ``alerts.endpoints`` reads and writes.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from llm_budgets.alerts.confirmation import ConfirmationInvalid
from llm_budgets.alerts.endpoints import confirmation_target, endpoint_email_confirm

TEMPLATE = "llm_budgets/alerts/confirm_email.html"


@csrf_exempt
@require_http_methods(["GET", "POST"])
def email_confirm(request: HttpRequest, token: str) -> HttpResponse:
    try:
        if request.method == "POST":
            endpoint, address = endpoint_email_confirm(token)
            confirmed = True
        else:
            endpoint, address, confirmed = confirmation_target(token)
    except ConfirmationInvalid as exc:
        problem = {"title": "This link cannot be used", "problem": exc.reason}
        return render(request, TEMPLATE, problem, status=400)
    tenant = endpoint.tenant
    context: dict[str, object] = {
        "title": "Alerts confirmed" if confirmed else "Confirm budget alerts",
        "address": address,
        "owner": (tenant.name or tenant.external_id) if tenant else "The operators",
        "confirmed": confirmed,
    }
    return render(request, TEMPLATE, context)
