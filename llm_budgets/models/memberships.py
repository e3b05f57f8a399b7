"""Who may see a tenant's usage pages: a host user's membership of a tenant, with a role."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from llm_budgets.models.tenancy import Tenant


class MembershipRole(models.TextChoices):
    ADMIN = "admin", _("Admin: the whole tenant")
    MEMBER = "member", _("Member: only their own end user's usage")


class Membership(models.Model):
    """A host user's access to one tenant's usage pages (the default ``TENANT_RESOLVER``).

    A member sees the end user whose external id is ``end_user_external_id``, or, when that is
    blank, the one the ``END_USER_ID`` setting maps the user to (by default the user's primary
    key): the rule documented in docs/pages.md.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="llm_budgets_memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(
        max_length=16, choices=MembershipRole.choices, default=MembershipRole.MEMBER
    )
    end_user_external_id = models.CharField(
        max_length=255,
        blank=True,
        help_text=_(
            "A member's end user in the ledger. Blank: the one LLM_BUDGETS['END_USER_ID'] "
            "maps the user to (by default the user's id)."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="llmb_membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant.external_id} ({self.role})"

    @property
    def end_user_key(self) -> str:
        """The external id of the end user a member sees (the documented matching rule)."""
        from llm_budgets.host_users import end_user_id

        return self.end_user_external_id or end_user_id(self.user)
