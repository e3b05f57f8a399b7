"""What an API key may see: a tenant key only its own tenant; anything else looks absent (404)."""

from __future__ import annotations

import functools
from uuid import UUID

from rest_framework.request import Request

from llm_budgets import validation
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.exceptions import InvalidUsage, ReservationNotFound, UnknownTenant
from llm_budgets.models import ApiKey, Reservation, Tenant
from llm_budgets.tenancy import tenants


def api_key_of(request: Request) -> ApiKey:
    assert isinstance(request.auth, ApiKey), "HasApiKey runs before any view"
    return request.auth


def query_id(request: Request, name: str, *, max_length: int = 255) -> str | None:
    """An optional identifier from the query string, checked like any other (400 if bad)."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    return validation.identifier(name, value, max_length=max_length)


def tenant_for(request: Request, external_id: str | None) -> Tenant:
    """The tenant the request acts for. A tenant key naming another tenant gets exactly the
    answer an unknown tenant gets, so keys cannot probe which tenants exist."""
    key = api_key_of(request)
    if external_id is not None:
        external_id = validation.identifier("tenant", external_id)
    if key.tenant is not None:
        if external_id is not None and external_id != key.tenant.external_id:
            raise UnknownTenant(external_id)
        return key.tenant
    if external_id is None:
        raise InvalidUsage(
            "tenant is required with an operator key: name the tenant the call is for.",
            field="tenant",
        )
    with ledger_guard("read"):
        return tenants.tenant_get(external_id)


def reservation_id_for(request: Request, reservation_id: str) -> UUID:
    """The reservation's id, if this key may see it; else ``ReservationNotFound`` (404). One
    indexed read without joins or a model instance, for views that hand the id to a service
    which loads (and locks) the row itself."""
    try:
        rid = UUID(reservation_id)
    except ValueError:
        raise ReservationNotFound(reservation_id) from None
    prefetched = getattr(request, "_llmb_reservation", None)
    if prefetched is not None and prefetched[0] == reservation_id:
        # Read with the key by authentication (``auth_read``), scoped the same way.
        if not prefetched[1]:
            raise ReservationNotFound(rid)
        return rid
    tenant_id = api_key_of(request).tenant_id
    with ledger_guard("read"):
        found = sql.fetch(
            _reservation_id_sql(tenant_scoped=tenant_id is not None),
            [sql.param(Reservation, "id", rid), *([] if tenant_id is None else [tenant_id])],
        )
    if not found:
        raise ReservationNotFound(rid)
    return rid


@functools.cache
def _reservation_id_sql(*, tenant_scoped: bool) -> str:
    """The reservation's id if it exists (and is the tenant's): one statement, no ORM
    compilation (``llm_budgets.db.statements``), as it runs before every commit."""
    scoped = f" AND {sql.column(Reservation, 'tenant')} = %s" if tenant_scoped else ""
    return f"SELECT id FROM {sql.table(Reservation)} WHERE id = %s{scoped}"  # noqa: S608


def reservation_for(request: Request, reservation_id: str) -> Reservation:
    """The reservation, if this key may see it; else ``ReservationNotFound`` (404)."""
    try:
        rid = UUID(reservation_id)
    except ValueError:
        raise ReservationNotFound(reservation_id) from None
    key = api_key_of(request)
    reservations = Reservation.objects.select_related("tenant", "end_user")
    if key.tenant_id is not None:
        reservations = reservations.filter(tenant_id=key.tenant_id)
    with ledger_guard("read"):
        reservation = reservations.filter(pk=rid).first()
    if reservation is None:
        raise ReservationNotFound(rid)
    return reservation
