"""A tenant admin's alert subscriptions (self-serve action ``alerts``): the alerts' one writer,
``alerts.endpoints``, called for the admin's own tenant once ``control.self_serve`` allows it."""

from __future__ import annotations

from llm_budgets.alerts.endpoints import endpoint_create, endpoint_delete
from llm_budgets.control.self_serve import TenantAdmin, self_serve_authorize
from llm_budgets.models import AlertEndpoint


def self_serve_subscribe(
    acting: TenantAdmin,
    *,
    kind: str,
    target: object,
    event_types: object,
    confirm_site: str,
    description: str = "",
) -> tuple[AlertEndpoint, str]:
    """Subscribe an email address or an endpoint of the tenant to alerts: ``endpoint_create``,
    the alerts' one writer, for ``acting.tenant`` only. Email addresses are each sent a link to
    ``confirm_site`` (where the tenant's people reach this app) and receive nothing until it is
    followed."""
    self_serve_authorize(acting, action="alerts", tenant=acting.tenant)
    # endpoint_create refuses the operators-only event types for any tenant's endpoint.
    return endpoint_create(
        tenant=acting.tenant,
        kind=kind,
        target=target,
        event_types=event_types,
        description=description,
        actor=acting.actor,
        confirm_site=confirm_site,
    )


def self_serve_unsubscribe(acting: TenantAdmin, endpoint: AlertEndpoint) -> None:
    """Remove one of the tenant's alert endpoints (``endpoint_delete``)."""
    self_serve_authorize(acting, action="alerts", tenant=endpoint.tenant)
    endpoint_delete(endpoint, actor=acting.actor)
