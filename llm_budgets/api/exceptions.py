"""The one place where errors become HTTP responses: ``{"error": {"code", "message", ...}}``.

A ``BudgetError``'s status class follows whose fault it is (its ``fault``,
:data:`FAULT_STATUSES`): the caller's or the tenant's state a 4xx, a dependency's a 5xx with
``Retry-After``, ours a 500. Within it, a class maps by its ``code`` through
:data:`STATUS_BY_CODE`, walking the class hierarchy; a class with no entry gets its fault's
default, so a new subclass needs at most one line here. ``status_for`` never answers outside
its fault's statuses (a parent's entry that does not fit gives way to the fault's default), and
tests/test_error_faults.py walks every error class and refuses a table entry that does not fit.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404
from django.utils import timezone
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from llm_budgets.db.boundary import ledger_guard, operational
from llm_budgets.exceptions import BudgetError, BudgetExceeded, Fault, LedgerUnavailable, Wire
from llm_budgets.models import ApiKey
from llm_budgets.windows import rolling_window

STATUS_BY_CODE: dict[str, int] = {
    "budget_exceeded": status.HTTP_429_TOO_MANY_REQUESTS,
    "kill_switch_active": status.HTTP_403_FORBIDDEN,
    "self_serve_denied": status.HTTP_403_FORBIDDEN,
    "unknown_price": status.HTTP_422_UNPROCESSABLE_ENTITY,
    "output_ceiling_required": status.HTTP_422_UNPROCESSABLE_ENTITY,
    "no_budget": status.HTTP_422_UNPROCESSABLE_ENTITY,
    "usage_exceeds_hold": status.HTTP_422_UNPROCESSABLE_ENTITY,
    "unknown_tenant": status.HTTP_404_NOT_FOUND,
    "reservation_not_found": status.HTTP_404_NOT_FOUND,
    "reservation_state": status.HTTP_409_CONFLICT,
    "run_closed": status.HTTP_409_CONFLICT,
    "configuration_uncommitted": status.HTTP_409_CONFLICT,
    "new_id_capped": status.HTTP_429_TOO_MANY_REQUESTS,
    "idempotency_key_reused": status.HTTP_409_CONFLICT,
    "ledger_unavailable": status.HTTP_503_SERVICE_UNAVAILABLE,
    "payment_provider_error": status.HTTP_503_SERVICE_UNAVAILABLE,
    "invalid": status.HTTP_400_BAD_REQUEST,
    "budget_error": status.HTTP_400_BAD_REQUEST,
}

# The statuses each fault may be answered with; the first is its default.
FAULT_STATUSES: dict[Fault, tuple[int, ...]] = {
    Fault.CALLER: (400, 401, 403, 404, 405, 406, 409, 410, 413, 415, 422, 429),
    Fault.TENANT_STATE: (409, 400, 402, 403, 404, 422, 423, 429),
    Fault.DEPENDENCY: (503, 502, 504),
    Fault.OURS: (500,),
}


class HttpError(exceptions.APIException):
    """An error of the HTTP layer itself, with its own code (idempotency conflicts, features not
    built yet): no ``BudgetError`` says it. (The client's ``llm_budgets.client.ApiError`` is what
    a caller receives for it.)"""

    def __init__(
        self, message: str, *, code: str, status_code: int, retry_after: int | None = None
    ) -> None:
        super().__init__(message, code)
        self.status_code = status_code
        self.error_code = code
        self.retry_after = retry_after


def status_for(exc: BudgetError) -> int:
    """The error's HTTP status: its code's (or its nearest parent's) in :data:`STATUS_BY_CODE`
    if that fits its fault, else its fault's default (e.g. a dependency's error under a parent
    that is the caller's). An instance may say otherwise than its class (the client's
    ``ApiError``, rebuilt from a status)."""
    allowed = FAULT_STATUSES[exc.fault]
    for cls in type(exc).__mro__:
        code = cls.__dict__.get("code")
        if code in STATUS_BY_CODE:
            found = STATUS_BY_CODE[code]
            return found if found in allowed else allowed[0]
    return allowed[0]


def _plain(value: Any) -> Any:
    """JSON-ready: Decimal and datetime as strings, as in every other response."""
    return json.loads(json.dumps(value, cls=JSONEncoder))


def _decimal(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _encoded(wire: Wire, value: Any) -> Any:
    if value is None:
        return None
    if wire.kind == "money":
        return _decimal(value)
    if wire.kind == "time" and len(wire.where) > 1:
        return value.isoformat()  # nested times (a refusal's resets_at) keep their +00:00 form
    return value


def budget_error_body(exc: BudgetError, replaced: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error body, laid out by the class's ``wire`` (``llm_budgets.exceptions.Wire``);
    ``replaced``: attributes (and ``message``) to send instead of the exception's own."""
    replaced = replaced or {}
    error: dict[str, Any] = {"code": exc.code, "message": replaced.get("message", exc.message)}
    for wire in type(exc).wire:
        value = _encoded(wire, replaced.get(wire.attr, getattr(exc, wire.attr, None)))
        *parents, name = wire.where
        if not parents and value is None:
            continue
        place = error
        for parent in parents:
            place = place.setdefault(parent, {})
        place[name] = value
    # A subclass (e.g. a host's) that declares no wire: its context as it is.
    sent = {wire.attr for wire in type(exc).wire}
    for key, value in exc.context.items():
        if key not in sent and value is not None and key not in error:
            error[key] = _decimal(value) if isinstance(value, Decimal) else value
    field = getattr(exc, "field", None)
    if field:
        error["fields"] = {field: [exc.message]}
    return _plain(error)


def budget_error_answer(
    exc: BudgetError, *, for_tenant: bool
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, body (``{"error": {...}}``) and headers (``Retry-After`` when the error says
    when to retry) that answer ``exc``. ``for_tenant``: the asker is a tenant (a tenant's key,
    a host's view answering a tenant's user), so a refusal by a budget every tenant shares is
    told without its figures."""
    headers = {}
    retry_after = getattr(exc, "retry_after", None)
    replaced = None
    if isinstance(exc, BudgetExceeded) and exc.shared and for_tenant:
        replaced = exc.without_figures(_shared_resets_at(exc))
        retry_after = _seconds_until(replaced["resets_at"])
    if isinstance(retry_after, int):
        headers["Retry-After"] = str(retry_after)
    return status_for(exc), {"error": budget_error_body(exc, replaced)}, headers


def _budget_error_response(exc: BudgetError, request: Any) -> Response:
    # Only a refusal by the shared budget depends on who asks: asking ``request.auth`` runs
    # authentication again where it was what failed (a ledger outage: a 500 from the handler).
    shared = isinstance(exc, BudgetExceeded) and exc.shared
    status_code, body, headers = budget_error_answer(
        exc, for_tenant=shared and _tenant_key(request)
    )
    return Response(body, status=status_code, headers=headers)


def _tenant_key(request: Any) -> bool:
    auth = getattr(request, "auth", None)
    return isinstance(auth, ApiKey) and not auth.is_operator


def _shared_resets_at(exc: BudgetExceeded) -> datetime | None:
    """When a refusal by the installation-wide budget can be retried, as a tenant may know it:
    a calendar window's end (a date, nobody's spend); for a rolling window, the latest time
    everything it counts now has left it (the engine's own figure follows other tenants'
    spend)."""
    window = rolling_window(exc.window)
    if window is None:
        return exc.resets_at
    return timezone.now() + window.duration + window.bucket


def _seconds_until(when: datetime | None) -> int | None:
    if when is None:
        return None
    return max(1, math.ceil((when - timezone.now()).total_seconds()))


def _field_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail, flattened to ``{"field.sub": [messages]}``."""
    if isinstance(detail, dict):
        fields: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = "non_field_errors" if key == "non_field_errors" and not prefix else str(key)
            fields.update(_field_errors(value, f"{prefix}.{name}" if prefix else name))
        return fields
    if isinstance(detail, list) and detail and all(not isinstance(d, dict | list) for d in detail):
        return {prefix or "non_field_errors": [str(d) for d in detail]}
    if isinstance(detail, list):
        fields = {}
        for index, value in enumerate(detail):
            fields.update(_field_errors(value, f"{prefix}.{index}" if prefix else str(index)))
        return fields
    return {prefix or "non_field_errors": [str(detail)]}


def _unavailable(exc: DatabaseError, context: dict[str, Any]) -> LedgerUnavailable:
    """An outage met outside the view's own ``ledger_guard`` (say, a lazy read while building
    its answer): the same ``LedgerUnavailable`` (a 503) as any other, never a 500. The long
    fault soak saw a kill-switch trip answer 500 this way."""
    request = context.get("request")
    action = f"{request.method} {request.path}" if request is not None else "a request"
    try:
        with ledger_guard(action):
            raise exc
    except LedgerUnavailable as unavailable:
        return unavailable
    raise AssertionError("ledger_guard turns an operational error into LedgerUnavailable")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler for the llm_budgets views (set per view, not project-wide)."""
    if isinstance(exc, DatabaseError) and operational(exc):
        exc = _unavailable(exc, context)
    if isinstance(exc, BudgetError):
        return _budget_error_response(exc, context.get("request"))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None  # a bug: let Django report it as a 500
    headers: dict[str, str] = {}
    error: dict[str, Any]
    if isinstance(exc, exceptions.ValidationError):
        fields = _field_errors(exc.detail)
        summary = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in fields.items())
        error = {"code": "invalid", "message": f"Invalid request. {summary}", "fields": fields}
        if len(fields) == 1:
            error["field"] = next(iter(fields))
    else:
        codes = exc.get_codes()
        code = getattr(exc, "error_code", None) or (codes if isinstance(codes, str) else None)
        error = {"code": code or exc.default_code, "message": str(exc.detail)}
    wait = getattr(exc, "wait", None) or getattr(exc, "retry_after", None)
    if wait:
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
    auth_header = getattr(exc, "auth_header", None)
    if auth_header:
        headers["WWW-Authenticate"] = auth_header
    return Response({"error": error}, status=exc.status_code, headers=headers)
