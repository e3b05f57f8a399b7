"""Control: kill switches, temporary raises, and the compact record of refusals."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from llm_budgets import clock, money
from llm_budgets.models.api import ApiKey
from llm_budgets.models.budgets import Budget, Run
from llm_budgets.models.tenancy import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS


class KillSwitch(models.Model):
    """An immediate stop for a scope. Empty fields widen it: no field at all is global; several
    fields are their intersection (e.g. one model for one tenant).

    Active while ``cleared_at`` is empty and ``auto_clear_at`` (if any) has not passed. An
    automatic trip carries no ``auto_clear_at`` unless its plan says so: a person clears it.
    """

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="kill_switches"
    )
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.CASCADE, related_name="kill_switches"
    )
    provider = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=128, blank=True)
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="kill_switches",
        help_text="Only calls made through this REST API key.",
    )
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="kill_switches",
        help_text="Only calls naming this run.",
    )
    # The scope in one string, so "one active switch per scope" is a plain unique constraint
    # on both databases (NULLs in a composite unique key would be distinct).
    scope_key = models.CharField(max_length=400, editable=False)
    reason = models.TextField()
    tripped_by = models.CharField(max_length=255, blank=True)
    tripped_at = models.DateTimeField()
    automatic = models.BooleanField(default=False)
    detector = models.CharField(
        max_length=32, blank=True, help_text="The anomaly detector that tripped it, if any."
    )
    auto_clear_at = models.DateTimeField(
        null=True, blank=True, help_text="Empty: stays tripped until a person clears it."
    )
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by = models.CharField(max_length=255, blank=True)
    clear_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-tripped_at"]
        verbose_name_plural = "kill switches"
        constraints = [
            models.UniqueConstraint(
                fields=["scope_key"],
                condition=Q(cleared_at__isnull=True),
                name="llmb_killswitch_one_open_per_scope",
            ),
            models.CheckConstraint(
                condition=Q(end_user__isnull=True) | Q(tenant__isnull=False),
                name="llmb_killswitch_end_user_has_tenant",
            ),
            models.CheckConstraint(
                condition=Q(run__isnull=True) | Q(tenant__isnull=False),
                name="llmb_killswitch_run_has_tenant",
            ),
        ]
        # Admission reads only uncleared switches: a partial index keeps that read tiny however
        # long the history grows.
        indexes = [
            models.Index(
                fields=["tenant"],
                condition=Q(cleared_at__isnull=True),
                name="llmb_killswitch_open",
            )
        ]

    def __str__(self) -> str:
        return f"kill switch on {self.scope_label}"

    @property
    def scope_label(self) -> str:
        """``global``, or the intersection as a person reads it: ``tenant acme, model gpt-4o``."""
        parts = []
        if self.end_user_id is not None:
            parts.append(f"end user {self.end_user}")
        elif self.tenant_id is not None and self.run_id is None:
            parts.append(f"tenant {self.tenant.external_id}")  # type: ignore[union-attr]
        if self.provider:
            parts.append(f"provider {self.provider}")
        if self.model:
            parts.append(f"model {self.model}")
        if self.api_key_id is not None:
            parts.append(f"API key {self.api_key.prefix}")  # type: ignore[union-attr]
        if self.run_id is not None:
            parts.append(str(self.run))
        return ", ".join(parts) or "global"


class BudgetRaise(models.Model):
    """A temporary addition to a budget's limit, from ``starts_at`` until ``ends_at``.

    Admission adds every active raise to the limit; once ``ends_at`` passes it simply stops
    counting, so expiry needs no job.
    """

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="raises")
    amount = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.TextField()
    granted_by = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="llmb_raise_amount_positive"),
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="llmb_raise_ends_after_start"
            ),
        ]
        indexes = [models.Index(fields=["budget", "ends_at"], name="llmb_raise_budget_ends")]

    def __str__(self) -> str:
        return (
            f"+{money.money(self.amount, self.budget.currency)} on budget {self.budget_id} "
            f"until {clock.when(self.ends_at, None)}"
        )


class RefusalKind(models.TextChoices):
    BUDGET = "budget", "Budget exceeded"
    KILL_SWITCH = "kill_switch", "Kill switch"


class Refusal(models.Model):
    """One refused admission, compact: enough to answer "why was I blocked?"."""

    created_at = models.DateTimeField(db_index=True)
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.CASCADE, related_name="refusals")
    # Set only for an end user seen before the call: a refused call creates no end user.
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    end_user_external_id = models.CharField(
        max_length=255, blank=True, help_text="The end user the call named, as asked."
    )
    run_external_id = models.CharField(
        max_length=255, blank=True, help_text="The run the call named, as asked."
    )
    provider = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=RefusalKind.choices)
    budget = models.ForeignKey(
        Budget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    kill_switch = models.ForeignKey(
        KillSwitch, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    detail = models.CharField(max_length=255, help_text="The budget or switch, as a label.")
    requested = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, null=True, blank=True
    )
    remaining = models.DecimalField(
        max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, null=True, blank=True
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="llmb_refusal_tenant_time"),
            # One end user's refusals (a member's page, staff's end user page), by the id asked.
            models.Index(
                fields=["tenant", "end_user_external_id", "-created_at"],
                name="llmb_refusal_end_user_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{clock.when(self.created_at, None)} {self.kind}: {self.detail}"
