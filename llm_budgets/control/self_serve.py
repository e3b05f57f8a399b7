"""Self-serve: what a tenant's own admin may change, checked inside the services they call.

A :class:`TenantAdmin` says who acts (a host user with the tenant's ``admin`` role, or a tenant
API key the operators marked ``self_serve``) and for which tenant. Each service that accepts
``acting=`` (``control/limits.py``, ``control/raises.py``, ``engine/adjustments.py``,
``control/api_keys.py``, ``alerts/self_serve.py``) calls :func:`self_serve_authorize`
before it writes, so the pages and the REST API cannot drift apart and a view that forgot a check
still cannot widen anyone's spending: the view's own checks are for showing the right forms only.

The operators decide (docs/pages.md, "Tenant admins act"): the switch, the plan's
``self_serve`` overridden by the tenant's (off by default: a billing component should not let
customers move their own caps until someone chose to); the ceiling, the plan's
``self_serve_ceiling`` overridden by the tenant's; and ``LLM_BUDGETS["SELF_SERVE_HIDDEN_ACTIONS"]``.
No budget a tenant admin sets (raises included) may exceed the ceiling, nor the tenant's own
budget of the same window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import SELF_SERVE_ACTIONS, conf
from llm_budgets.exceptions import SelfServeDenied
from llm_budgets.models import (
    AuditEvent,
    Budget,
    BudgetRaise,
    Membership,
    MembershipRole,
    Scope,
    Tenant,
)
from llm_budgets.money import money as money_text

# The scopes a tenant admin may set: their people's and integrations', never the tenant's own
# cap (the operators' contract with the tenant) nor the installation's.
SELF_SERVE_SCOPES = frozenset(
    {
        Scope.END_USER,
        Scope.END_USER_DEFAULT,
        Scope.API_KEY,
        Scope.API_KEY_DEFAULT,
        Scope.RUN,
        Scope.RUN_DEFAULT,
        Scope.TAG,
    }
)


@dataclass(frozen=True)
class TenantAdmin:
    """Who acts for which tenant. ``user_id``: the host user's primary key (a person), checked
    again in the service against a ``member`` membership; None for a self-serve API key."""

    tenant: Tenant
    person: str
    user_id: Any = None

    @property
    def actor(self) -> str:
        """The audit log's actor: the person and the tenant they acted for."""
        return f"{self.person} (tenant admin of {self.tenant.external_id})"


def self_serve_enabled(tenant: Tenant) -> bool:
    """The tenant's switch, else its plan's; off without either."""
    if tenant.self_serve is not None:
        return tenant.self_serve
    return bool(tenant.plan is not None and tenant.plan.self_serve)


def self_serve_ceiling(tenant: Tenant) -> Decimal | None:
    """The operators' ceiling for one self-serve budget: the tenant's, else its plan's."""
    if tenant.self_serve_ceiling is not None:
        return tenant.self_serve_ceiling
    return None if tenant.plan is None else tenant.plan.self_serve_ceiling


def self_serve_actions(tenant: Tenant) -> list[str]:
    """The actions a tenant admin of ``tenant`` may take now (none when self-serve is off)."""
    if not self_serve_enabled(tenant):
        return []
    hidden = set(conf.SELF_SERVE_HIDDEN_ACTIONS)
    return [a for a in SELF_SERVE_ACTIONS if a not in hidden]


def self_serve_authorize(acting: TenantAdmin, *, action: str, tenant: Tenant | None) -> None:
    """Refuse (``SelfServeDenied``) unless ``acting`` may take ``action`` on ``tenant``'s data."""
    if tenant is None or tenant.pk != acting.tenant.pk:
        # Another tenant's row (or an installation-wide one): the same words whatever it is, so
        # the answer tells nothing about it.
        raise SelfServeDenied(
            "That belongs to another organisation, or to the operators: a tenant admin changes "
            "only their own organisation's budgets, keys and alerts.",
            action=action,
        )
    fresh = Tenant.objects.select_related("plan").get(pk=tenant.pk)  # the switch as stored now
    if not self_serve_enabled(fresh):
        raise SelfServeDenied(
            f"Self-serve is off for {fresh.external_id}: ask the operators to turn it on for "
            "the organisation or its plan, or ask support to make the change.",
            action=action,
        )
    if action not in self_serve_actions(fresh):
        raise SelfServeDenied(
            f"This installation does not let tenant admins do this ({action}); ask support.",
            action=action,
        )
    if (
        acting.user_id is not None
        and Membership.objects.filter(
            user_id=acting.user_id, tenant=fresh, role=MembershipRole.MEMBER
        ).exists()
    ):
        raise SelfServeDenied(
            "Members see their own usage only; an admin of the organisation makes changes.",
            action=action,
        )


def self_serve_room(tenant: Tenant, window: str) -> Decimal | None:
    """The most a self-serve budget of ``window`` may be: the ceiling, and no more than the
    tenant's own budget of that window when it has one. None: no ceiling set (nothing may be)."""
    ceiling = self_serve_ceiling(tenant)
    if ceiling is None:
        return None
    own = (
        Budget.objects.filter(scope=Scope.TENANT, tenant=tenant, window=window)
        .values_list("limit", flat=True)
        .first()
    )
    return ceiling if own is None else min(ceiling, own)


def self_serve_limit_check(
    tenant: Tenant, *, window: str, amount: Decimal, action: str, field: str = "amount"
) -> None:
    """Refuse an amount (a limit, or a limit with its raises) above the room of ``window``."""
    room = self_serve_room(tenant, window)
    if room is None:
        raise SelfServeDenied(
            f"No self-serve ceiling is set for {tenant.external_id}: the operators set one on "
            "the organisation or its plan before tenant admins can set budgets.",
            action=action,
            field=field,
        )
    if amount > room:
        raise SelfServeDenied(
            f"{money_text(amount, conf.CURRENCY)} is above the most this organisation may set "
            f"for a {window} budget, {money_text(room, conf.CURRENCY)} (the operators' ceiling "
            "and the organisation's own budget): give at most that, or ask support.",
            action=action,
            field=field,
        )


def raises_active(budget: Budget, now: datetime | None = None) -> Decimal:
    """The sum of ``budget``'s raises in force at ``now``."""
    now = now or timezone.now()
    total = BudgetRaise.objects.filter(
        budget=budget, starts_at__lte=now, ends_at__gt=now
    ).aggregate(total=Sum("amount"))["total"]
    return total or Decimal(0)


def raise_target(tenant: Tenant, end_user: str, window: str) -> Budget | None:
    """The budget a raise for ``end_user`` adds to: their own of ``window``. Never the default
    for each user: a raise on it would lift every user, not the one named."""
    return Budget.objects.filter(
        tenant=tenant, scope=Scope.END_USER, end_user__external_id=end_user, window=window
    ).first()


def tenant_self_serve_set(
    tenant: Tenant,
    *,
    enabled: bool | None,
    ceiling: object = None,
    actor: str = "",
    reason: str = "",
) -> Tenant:
    """The operators' override for one tenant: ``enabled`` (None: the plan's switch) and
    ``ceiling`` (None: the plan's). Audited; never a tenant admin's to call."""
    amount = None if ceiling is None else validation.money("ceiling", ceiling)
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = {"self_serve": locked.self_serve, "ceiling": _text(locked.self_serve_ceiling)}
        locked.self_serve, locked.self_serve_ceiling = enabled, amount
        locked.save(update_fields=["self_serve", "self_serve_ceiling"])
        AuditEvent.objects.create(
            action="tenant.self_serve",
            actor=actor,
            tenant=locked,
            target=f"tenant {locked.external_id}",
            before=before,
            after={"self_serve": enabled, "ceiling": _text(amount)},
            reason=reason,
        )
    return locked


def _text(amount: Decimal | None) -> str | None:
    return None if amount is None else str(amount)
