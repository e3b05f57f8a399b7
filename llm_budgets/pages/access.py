"""Who sees which tenant on the usage pages.

``LLM_BUDGETS["TENANT_RESOLVER"]`` names a callable ``(request) -> tenant external id | None``;
``None`` means no access. The default, :func:`membership_tenant`, reads :class:`Membership`. Once
the tenant is known, a ``member`` membership of that tenant narrows the view to the member's own
end user, whichever resolver named it. Staff who may view tenants in the admin (the support
roles, superusers) may look at any tenant with ``?tenant=<external id>``; for anyone else that
parameter only chooses among their own memberships.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from llm_budgets.conf import conf
from llm_budgets.models import Membership, MembershipRole, Tenant

TENANT_PARAMETER = "tenant"
# The admin permission that lets staff open any tenant's pages with ?tenant=.
STAFF_PERMISSION = "llm_budgets.view_tenant"


class LoginRequired(Exception):
    """No tenant for an anonymous visitor: the view sends them to the login page."""


class TenantChoice(Exception):
    """Support staff with no tenant of their own and no ``?tenant=``: the view shows the tenant
    picker instead of a 403."""


@dataclass(frozen=True)
class Viewer:
    """What a request may see: one tenant, and for a member only one end user of it."""

    tenant: Tenant
    end_user: str | None = None  # a member's end user (external id); None: the whole tenant
    staff: bool = False  # a support person looking at a tenant with ?tenant=

    @property
    def is_member(self) -> bool:
        return self.end_user is not None


def membership_tenant(request: HttpRequest) -> str | None:
    """The default resolver: the tenant of the user's membership (the one named by ``?tenant=``
    if the user has several), or None."""
    user = request.user
    if not user.is_authenticated:
        return None
    memberships = Membership.objects.filter(user=user).order_by("tenant__external_id")
    wanted = request.GET.get(TENANT_PARAMETER)
    if wanted:
        chosen = memberships.filter(tenant__external_id=wanted).values_list(
            "tenant__external_id", flat=True
        )
        if chosen:
            return chosen[0]
    return memberships.values_list("tenant__external_id", flat=True).first()


def may_view_any_tenant(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Active staff with the admin's view permission on tenants (support roles, superusers)."""
    has_perm = getattr(user, "has_perm", None)
    staff = bool(user.is_active and getattr(user, "is_staff", False))
    return staff and has_perm is not None and bool(has_perm(STAFF_PERMISSION))


def _resolver() -> Callable[[HttpRequest], Any]:
    resolver: Callable[[HttpRequest], Any] = import_string(conf.TENANT_RESOLVER)
    return resolver


def viewer_for(request: HttpRequest) -> Viewer:
    """The request's view of one tenant. Raises ``LoginRequired`` (anonymous, no tenant),
    ``TenantChoice`` (support staff without a tenant of their own, no ``?tenant=``),
    ``PermissionDenied`` (logged in, no tenant) or ``Http404`` (staff naming an unknown one)."""
    user = request.user
    wanted = request.GET.get(TENANT_PARAMETER)
    if wanted and may_view_any_tenant(user):
        tenant = Tenant.objects.select_related("plan").filter(external_id=wanted).first()
        if tenant is None:
            raise Http404(_("No tenant with this id."))
        return Viewer(tenant=tenant, staff=True)
    external_id = _resolver()(request)
    if external_id is None:
        if not user.is_authenticated:
            raise LoginRequired
        if may_view_any_tenant(user):
            raise TenantChoice
        raise PermissionDenied(_("Your account has no access to a tenant's usage."))
    tenant = Tenant.objects.select_related("plan").filter(external_id=str(external_id)).first()
    if tenant is None:
        # The host named a tenant the ledger has never seen: nothing to show, nothing to leak.
        raise PermissionDenied(_("No usage is recorded for your organisation yet."))
    end_user = None
    if user.is_authenticated:
        membership = (
            Membership.objects.select_related("user").filter(user=user, tenant=tenant).first()
        )
        if membership is not None and membership.role == MembershipRole.MEMBER:
            end_user = membership.end_user_key
    return Viewer(tenant=tenant, end_user=end_user)
