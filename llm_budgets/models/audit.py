"""The append-only audit log."""

from __future__ import annotations

from django.db import models

from llm_budgets import clock
from llm_budgets.models.tenancy import Tenant


class AuditEvent(models.Model):
    """Who changed what, when and why. Append-only."""

    action = models.CharField(max_length=64)
    actor = models.CharField(
        max_length=255, blank=True, help_text="Username, or the code path that acted."
    )
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.CharField(max_length=255, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return (
            f"{clock.when(self.created_at, None)} {self.action} {clock.readable(self.target, None)}"
        )
