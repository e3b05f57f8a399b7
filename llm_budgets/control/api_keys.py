"""REST API keys: created (the secret is returned once, only its hash is stored) and revoked."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.control.self_serve import TenantAdmin, self_serve_authorize
from llm_budgets.exceptions import InvalidUsage, SelfServeDenied
from llm_budgets.models import ApiKey, AuditEvent, Tenant
from llm_budgets.tenancy.tenants import tenant_get


def api_key_create(
    *,
    tenant: str | None,
    name: str,
    expires_at: datetime | None = None,
    actor: str = "",
    acting: TenantAdmin | None = None,
    self_serve: bool = False,
) -> tuple[ApiKey, str]:
    """Create a key for one tenant (by external id), or an operator key (``tenant=None``).

    Returns the key row and the key itself, ``<prefix>.<secret>``: show it once, it cannot be
    recovered. ``acting``: a tenant admin creating a key of their own tenant; such a key is never
    ``self_serve`` (only the operators grant that: ``self_serve=True``, a tenant key that may use
    the self-serve routes)."""
    name = validation.identifier("name", name, max_length=50)
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise InvalidUsage("expires_at must be timezone-aware.", field="expires_at")
        if expires_at <= timezone.now():
            raise InvalidUsage("expires_at must be in the future.", field="expires_at")
    api_key_self_serve_check(tenant=tenant, self_serve=self_serve, acting=acting)
    tenant_obj = None if tenant is None else tenant_get(tenant)
    if acting is not None:
        self_serve_authorize(acting, action="api_keys", tenant=tenant_obj)
        actor = acting.actor
    with transaction.atomic():
        if acting is not None and tenant_obj is not None:
            _self_serve_room_check(tenant_obj)
        created, key = ApiKey.objects.create_key(
            name=name, tenant=tenant_obj, expiry_date=expires_at, self_serve=self_serve
        )
        api_key = cast(ApiKey, created)
        AuditEvent.objects.create(
            action="api_key.create",
            actor=actor,
            tenant=tenant_obj,
            target=f"api key {api_key.prefix}",
            after={"name": name, "scope": api_key.scope_label, "self_serve": self_serve},
        )
    return api_key, key


def api_key_live_count(tenant: Tenant) -> int:
    """The tenant's keys that authenticate: neither revoked nor expired."""
    unexpired = Q(expiry_date__isnull=True) | Q(expiry_date__gt=timezone.now())
    return ApiKey.objects.filter(unexpired, tenant=tenant, revoked=False).count()


def _self_serve_room_check(tenant: Tenant) -> None:
    """Refuse a tenant admin's key beyond ``SELF_SERVE_MAX_API_KEYS`` live ones: each key has
    its own rate limit, so unlimited keys would be an unlimited rate. The tenant's row is locked
    first, so two admins creating at once count each other (call in the creating transaction)."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("pk").first()
    most = conf.SELF_SERVE_MAX_API_KEYS
    live = api_key_live_count(tenant)
    if live >= most:
        raise SelfServeDenied(
            f"{tenant.external_id} has {live} live API keys, the most its admins may hold "
            f"(LLM_BUDGETS['SELF_SERVE_MAX_API_KEYS'] = {most}): revoke one it no longer uses, "
            "or ask the operators for another.",
            action="api_keys",
        )


def api_key_self_serve_check(
    *, tenant: str | None, self_serve: bool, acting: TenantAdmin | None = None
) -> None:
    """Refuse ``self_serve`` for an operator key or from a tenant admin (``InvalidUsage`` on
    the field ``self_serve``): api_key_create's rule, for forms to check before it."""
    if self_serve and (acting is not None or tenant is None):
        raise InvalidUsage(
            "Only the operators grant self_serve, and only to a tenant's key (an operator key "
            "already acts for every tenant).",
            field="self_serve",
        )


def api_key_revoke(
    api_key: ApiKey, *, actor: str = "", reason: str = "", acting: TenantAdmin | None = None
) -> None:
    """Revoke a key for good (revocation cannot be undone). ``acting``: a tenant admin revoking
    one of their own tenant's keys."""
    if acting is not None:
        self_serve_authorize(acting, action="api_keys", tenant=api_key.tenant)
        actor = acting.actor
    with transaction.atomic():
        if api_key.revoked:
            return
        api_key.revoked = True
        api_key.save(update_fields=["revoked"])
        AuditEvent.objects.create(
            action="api_key.revoke",
            actor=actor,
            tenant=api_key.tenant,
            target=f"api key {api_key.prefix}",
            reason=reason,
        )
