"""Budgets (scope x window x limit) and their per-period counters."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import ValidationError
from django.db import connections, models
from django.db.models import Q

from llm_budgets import clock, money
from llm_budgets.db import statements as sql
from llm_budgets.models.api import ApiKey
from llm_budgets.models.fields import validate_thresholds
from llm_budgets.models.tenancy import EndUser, Tenant
from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS
from llm_budgets.windows import Window, window_name


class Scope(models.TextChoices):
    GLOBAL = "global", "Global"
    TENANT = "tenant", "Tenant"
    END_USER_DEFAULT = "end_user_default", "Each end user of a tenant"
    END_USER = "end_user", "One end user"
    API_KEY_DEFAULT = "api_key_default", "Each API key of a tenant"
    API_KEY = "api_key", "One API key"
    RUN_DEFAULT = "run_default", "Each run of a tenant"
    RUN = "run", "One run"
    TAG = "tag", "One tag of a tenant"


# Scopes whose budget counts each end user, API key or run on a counter of its own (the
# ``"*"`` budgets), by the ``Counter`` dimension that splits them.
SHARED_BY = {
    Scope.END_USER_DEFAULT: "end_user",
    Scope.API_KEY_DEFAULT: "api_key",
    Scope.RUN_DEFAULT: "run",
}


class BudgetUnit(models.TextChoices):
    PROVIDER_COST = "provider_cost", "Provider cost"
    CUSTOMER_PRICE = "customer_price", "Customer price (with markup)"


def validate_window(value: str) -> None:
    """A calendar window or ``rolling:<duration>`` in its canonical spelling."""
    from llm_budgets.exceptions import InvalidUsage

    try:
        canonical = window_name(value)
    except InvalidUsage as exc:
        raise ValidationError(exc.message) from None
    if canonical != value:
        raise ValidationError(f"Write {value!r} as {canonical!r}.")


# A hot budget's counter is split into this many stripes unless set otherwise; at most
# ``MAX_STRIPES`` (the exact path locks them all).
DEFAULT_STRIPES = 8
MAX_STRIPES = 64


class Run(models.Model):
    """One agent run (or any unit of work the host names) inside a tenant, keyed by the host's
    id. Created on first sight, race-free; closed once (``runs.run_close``), after which its
    reservations are refused: a run's lifetime window ends when the run does."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    external_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["tenant_id", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "external_id"], name="llmb_run_unique_per_tenant"
            ),
        ]
        # The cap on new runs per tenant and day counts by it (engine.first_sight).
        indexes = [models.Index(fields=["tenant", "created_at"], name="llmb_run_tenant_new")]

    def __str__(self) -> str:
        return f"run {self.external_id} of {self.tenant.external_id}"


class Budget(models.Model):
    """One enforceable cap: a scope, a window and a limit."""

    scope = models.CharField(max_length=20, choices=Scope.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    end_user = models.ForeignKey(
        EndUser, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    tag_key = models.CharField(max_length=64, blank=True)
    tag_value = models.CharField(max_length=256, blank=True)
    # A calendar window (``Window``) or a rolling one such as ``rolling:1h``, stored canonically
    # (``rolling:24h`` is ``rolling:1d``) so the unique constraints see one spelling.
    window = models.CharField(
        max_length=20,
        validators=[validate_window],
        help_text="month, day, hour, lifetime, or rolling:<duration> such as rolling:1h or "
        "rolling:7d.",
    )
    limit = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES)
    currency = models.CharField(max_length=3, default="USD")
    warning_thresholds = models.JSONField(
        null=True,
        blank=True,
        validators=[validate_thresholds],
        help_text="Percentages that trigger a warning for this budget, e.g. [80, 100]; [] for "
        "none. Empty: the tenant's plan's, else LLM_BUDGETS['WARNING_THRESHOLDS'].",
    )
    unit = models.CharField(
        max_length=20, choices=BudgetUnit.choices, default=BudgetUnit.PROVIDER_COST
    )
    hot = models.BooleanField(
        default=False,
        help_text="Split this budget's counter into stripes, so admissions under it do not all "
        "lock one row (docs/design/hot-caps.md). Rolling windows ignore it.",
    )
    stripes = models.PositiveSmallIntegerField(
        default=DEFAULT_STRIPES,
        help_text=f"How many stripes a hot budget's counter is split into (1 to {MAX_STRIPES}).",
    )
    prepaid = models.BooleanField(
        default=False,
        help_text="A tenant's prepaid balance (billing/credits.py): a lifetime limit that only "
        "credits change; a refusal says to top up.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope", "tenant_id", "end_user_id", "window"]
        constraints = [
            models.CheckConstraint(
                condition=Q(limit__gte=0), name="llmb_budget_limit_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(stripes__gte=1, stripes__lte=MAX_STRIPES),
                name="llmb_budget_stripes_in_range",
            ),
            models.CheckConstraint(
                condition=(
                    Q(scope=Scope.GLOBAL, tenant__isnull=True, end_user__isnull=True)
                    | Q(scope=Scope.TENANT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.END_USER_DEFAULT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.END_USER, tenant__isnull=False, end_user__isnull=False)
                    | Q(scope=Scope.API_KEY_DEFAULT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.API_KEY, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.RUN_DEFAULT, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.RUN, tenant__isnull=False, end_user__isnull=True)
                    | Q(scope=Scope.TAG, tenant__isnull=False, end_user__isnull=True)
                ),
                name="llmb_budget_scope_matches_owner",
            ),
            models.CheckConstraint(
                condition=(
                    (Q(scope=Scope.API_KEY) & Q(api_key__isnull=False))
                    | (~Q(scope=Scope.API_KEY) & Q(api_key__isnull=True))
                )
                & (
                    (Q(scope=Scope.RUN) & Q(run__isnull=False))
                    | (~Q(scope=Scope.RUN) & Q(run__isnull=True))
                )
                & (
                    (Q(scope=Scope.TAG) & ~Q(tag_key="") & ~Q(tag_value=""))
                    | (~Q(scope=Scope.TAG) & Q(tag_key="") & Q(tag_value=""))
                ),
                name="llmb_budget_scope_names_its_key_run_tag",
            ),
            models.CheckConstraint(
                condition=Q(window__in=Window.values) | Q(window__startswith="rolling:"),
                name="llmb_budget_window_known",
            ),
            models.UniqueConstraint(
                fields=["window"],
                condition=Q(scope=Scope.GLOBAL),
                name="llmb_budget_one_global_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "window"],
                condition=Q(scope=Scope.TENANT),
                name="llmb_budget_one_tenant_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "window"],
                condition=Q(scope=Scope.END_USER_DEFAULT),
                name="llmb_budget_one_user_default_per_window",
            ),
            models.UniqueConstraint(
                fields=["end_user", "window"],
                condition=Q(scope=Scope.END_USER),
                name="llmb_budget_one_end_user_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "scope", "window"],
                condition=Q(scope__in=[Scope.API_KEY_DEFAULT, Scope.RUN_DEFAULT]),
                name="llmb_budget_one_key_or_run_default_per_window",
            ),
            models.UniqueConstraint(
                fields=["api_key", "tenant", "window"],
                condition=Q(scope=Scope.API_KEY),
                name="llmb_budget_one_api_key_per_window",
            ),
            models.UniqueConstraint(
                fields=["run", "window"],
                condition=Q(scope=Scope.RUN),
                name="llmb_budget_one_run_per_window",
            ),
            models.UniqueConstraint(
                fields=["tenant", "tag_key", "tag_value", "window"],
                condition=Q(scope=Scope.TAG),
                name="llmb_budget_one_tag_per_window",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope_label} {self.window} {money.money(self.limit, self.currency)}"

    @property
    def scope_label(self) -> str:
        """The scope as a person reads it: ``global``, ``tenant acme``, ``end user acme/u-1``."""
        if self.scope == Scope.GLOBAL:
            return "global"
        if self.scope == Scope.TENANT:
            return f"tenant {self.tenant.external_id}"  # type: ignore[union-attr]
        if self.scope == Scope.END_USER_DEFAULT:
            return f"end user {self.tenant.external_id}/*"  # type: ignore[union-attr]
        if self.scope == Scope.API_KEY_DEFAULT:
            return f"API key * of {self.tenant.external_id}"  # type: ignore[union-attr]
        if self.scope == Scope.API_KEY:
            return f"API key {self.api_key.prefix}"  # type: ignore[union-attr]
        if self.scope == Scope.RUN_DEFAULT:
            return f"run * of {self.tenant.external_id}"  # type: ignore[union-attr]
        if self.scope == Scope.RUN:
            return f"run {self.run.external_id} of {self.tenant.external_id}"  # type: ignore[union-attr]
        if self.scope == Scope.TAG:
            return f"tag {self.tag_key}={self.tag_value} of {self.tenant.external_id}"  # type: ignore[union-attr]
        return f"end user {self.tenant.external_id}/{self.end_user.external_id}"  # type: ignore[union-attr]


class CounterQuerySet(models.QuerySet["Counter"]):
    def write(
        self,
        counters: Sequence[Counter],
        fields: Sequence[str],
        *,
        transition_writes: Sequence[sql.Statement] = (),
        commit: bool = False,
    ) -> None:
        """Store new values of counters the caller has locked, together with the other writes
        of the same transition (``transition_writes``: its reservation, holds, ledger line or
        state), which run first (SQLite) or in the same statement (PostgreSQL). ``commit``: the
        transaction's last writes, committed in the same round trip where they can be
        (``statements.run_committing``).

        On PostgreSQL an ``UPDATE ... FROM (VALUES ...)``, sent with ``transition_writes`` as one
        statement
        (``statements.run``): ``bulk_update`` builds a ``CASE WHEN`` per row and field, which
        costs the ORM about ten times the client CPU, spent while every other call under the
        same budgets waits for these rows. Elsewhere the writes, then ``bulk_update``."""
        connection = connections[self.db]
        if connection.vendor != "postgresql" or not counters:
            sql.run(transition_writes)
            Counter.objects.bulk_update(counters, fields)
            return
        qn = connection.ops.quote_name
        table = qn(self.model._meta.db_table)
        columns = [qn(f) for f in fields]  # counter fields are named as their columns
        row = "(%s::bigint" + ", %s::numeric" * len(fields) + ")"
        sets = ", ".join(f"{c} = v.{c}" for c in columns)
        text = (
            f"UPDATE {table} SET {sets} FROM (VALUES {', '.join([row] * len(counters))}) "  # noqa: S608
            f"AS v(id, {', '.join(columns)}) WHERE {table}.id = v.id"
        )
        params = [value for c in counters for value in (c.pk, *(getattr(c, f) for f in fields))]
        (sql.run_committing if commit else sql.run)([*transition_writes, (text, params)])


class Counter(models.Model):
    """``(budget, period_start) -> spent, reserved``: the only rows admission locks.

    A ``"*"`` budget (each end user of a tenant) is a cap per end user, so its counters are
    per ``(budget, end_user, period_start)``; every other budget's have no end user.
    """

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="counters")
    end_user = models.ForeignKey(
        EndUser,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="default_budget_counters",
        help_text="Whose share of an each-end-user budget this counts; empty for other budgets.",
    )
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="counters",
        help_text="Whose share of an each-run budget this counts; empty for other budgets.",
    )
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="counters",
        help_text="Whose share of an each-API-key budget this counts; empty for other budgets.",
    )
    period_start = models.DateTimeField()
    spent = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0)
    reserved = models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, default=0)
    # A hot budget's counter is split into stripes 0..K-1 (Budget.stripes), each a row with its
    # own allowance; the cap is the sum over them (engine.stripes). Others have stripe 0 only.
    stripe = models.PositiveSmallIntegerField(default=0)
    allowance = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="What this stripe may admit up to on its own (spent + reserved); empty when "
        "the counter is not split.",
    )
    split_for = models.DecimalField(
        max_digits=MAX_DIGITS,
        decimal_places=DECIMAL_PLACES,
        null=True,
        blank=True,
        help_text="The effective limit the allowances were split for: a stripe admits on its "
        "own only while the budget's effective limit is still this.",
    )

    objects = CounterQuerySet.as_manager()

    class Meta:
        ordering = ["budget_id", "-period_start"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start", "stripe"],
                condition=Q(end_user__isnull=True, run__isnull=True, api_key__isnull=True),
                name="llmb_counter_one_per_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "run", "period_start", "stripe"],
                condition=Q(run__isnull=False),
                name="llmb_counter_one_per_run_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "api_key", "period_start", "stripe"],
                condition=Q(api_key__isnull=False),
                name="llmb_counter_one_per_api_key_period",
            ),
            models.UniqueConstraint(
                fields=["budget", "end_user", "period_start", "stripe"],
                condition=Q(end_user__isnull=False),
                name="llmb_counter_one_per_end_user_period",
            ),
            models.CheckConstraint(
                condition=Q(spent__gte=0), name="llmb_counter_spent_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(reserved__gte=0), name="llmb_counter_reserved_non_negative"
            ),
        ]
        indexes = [
            # One period of an each-end-user budget, across its users (the tenant overview's
            # "users at the limit"): without it, every period of the budget is read.
            models.Index(
                fields=["budget", "period_start"],
                condition=Q(end_user__isnull=False),
                name="llmb_counter_users_in_period",
            ),
        ]

    def __str__(self) -> str:
        whose = f" for {self.end_user.external_id}" if self.end_user_id else ""  # type: ignore[union-attr]
        if self.run_id:
            whose = f" for run {self.run.external_id}"  # type: ignore[union-attr]
        if self.api_key_id:
            whose = f" for API key {self.api_key.prefix}"  # type: ignore[union-attr]
        stripe = f" (stripe {self.stripe})" if self.allowance is not None else ""
        return f"{self.budget}{whose} from {clock.when(self.period_start, None)}{stripe}"
