"""REST API keys (scoped to one tenant or operator-wide) and stored idempotent responses."""

from __future__ import annotations

from django.db import models

from llm_budgets.models.api_key_base import AbstractAPIKey
from llm_budgets.models.tenancy import Tenant


class ApiKey(AbstractAPIKey):
    """A key for the REST API: ``<prefix>.<secret>``, only its hash stored, shown once.

    With a tenant it acts only for that tenant; without one it is an operator key, acting for
    every tenant and allowed to change budgets.
    """

    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_keys",
        help_text="Empty: an operator key, acting for every tenant.",
    )
    self_serve = models.BooleanField(
        default=False,
        help_text="A tenant key that may also manage its tenant's budgets, raises, keys and "
        "alerts (the self-serve routes), within the tenant's self-serve switch and ceiling.",
    )

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API key"
        verbose_name_plural = "API keys"

    @property
    def is_operator(self) -> bool:
        return self.tenant_id is None

    @property
    def scope_label(self) -> str:
        return "operator" if self.tenant is None else f"tenant {self.tenant.external_id}"


class IdempotencyRecord(models.Model):
    """The first response to a POST that carried an ``Idempotency-Key``, replayed on retries.

    The row is inserted *before* the request runs (the unique constraint decides the race) and
    holds no response until it finishes; only successful responses are kept, since a failed
    request changed nothing and its retry may run again.
    """

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=512)
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    status_code = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Empty while the first request is still running."
    )
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["api_key", "key"], name="llmb_idempotency_one_per_key"),
        ]
        indexes = [models.Index(fields=["created_at"], name="llmb_idempotency_created")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"


class RateCounter(models.Model):
    """Hits of one throttle key (an API key, or a source's failed authentications) in one fixed
    window. In the database, so every web process counts against the same number."""

    key = models.CharField(max_length=200)
    window_start = models.BigIntegerField(help_text="Unix seconds at the start of the window.")
    hits = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["key", "window_start"], name="llmb_rate_counter_one_per_window"
            ),
        ]
        indexes = [models.Index(fields=["window_start"], name="llmb_rate_counter_window")]

    def __str__(self) -> str:
        return f"{self.key} @ {self.window_start}: {self.hits}"
