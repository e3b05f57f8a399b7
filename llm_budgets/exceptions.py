"""Every error the app raises, under one base, :class:`BudgetError`.

Errors carry context as attributes (for the REST layer and for logs) and a message a person can
act on. Each class declares whose fault it is (:class:`Fault`); HTTP mapping lives only in the
API layer, which derives the status class from it (``llm_budgets.api.exceptions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, ClassVar

from llm_budgets import clock
from llm_budgets.money import display


@dataclass(frozen=True)
class Wire:
    """How one attribute of an error travels in the REST error body
    (``{"error": {"code", "message", ...}}``). The one definition of the error wire format: the
    API's responses (``llm_budgets.api.exceptions``), its OpenAPI schema and the HTTP client's
    rebuilt exceptions (``llm_budgets.client``) are all derived from each class's ``wire``.

    ``kind``: ``str``, ``int``, ``bool``, ``money`` (a Decimal, sent as a string), ``time`` (an
    aware datetime, ISO 8601). ``path``: where in the body, default the attribute's name; a
    top-level value that is None is left out, a nested one is sent as null."""

    attr: str
    kind: str = "str"
    path: tuple[str, ...] = ()
    help: str = ""
    nullable: bool = False  # a nested value that may be null

    @property
    def where(self) -> tuple[str, ...]:
        return self.path or (self.attr,)


class Fault(StrEnum):
    """Whose fault an error is: what a caller can do about it, and the HTTP status class it is
    answered with (``llm_budgets.api.exceptions.FAULT_STATUSES``). Every error class declares
    its own (``fault = Fault.CALLER``), even where its parent's would fit, so that each one was
    decided (tests/test_error_faults.py walks the whole family)."""

    # The request itself is wrong (a bad or missing argument, an unknown id, a step out of
    # order): resending it unchanged fails again. A 4xx.
    CALLER = "caller"
    # The request is well formed, but the state of the tenant or its configuration refuses it
    # (a budget spent, a kill switch, no price, no balance, a closed run): it may pass once that
    # state changes (a reset, a person's action). A 4xx.
    TENANT_STATE = "tenant_state"
    # Something we depend on failed or could not be reached (the database, Stripe): the same
    # request may succeed later. A 5xx (502, 503, 504) with ``Retry-After``; the error carries
    # ``retry_after``.
    DEPENDENCY = "dependency"
    # A fault in this app: a bug to fix, not to retry. A 500.
    OURS = "ours"


class BudgetError(Exception):
    """Base of every llm_budgets error."""

    code = "budget_error"
    # Whose fault it is. The base's stands for a host's subclass that declares none (answered
    # 400, as before); every class of the app declares its own.
    fault: Fault = Fault.CALLER
    # The attributes sent beside code and message; a subclass lists its own and its parent's.
    wire: ClassVar[tuple[Wire, ...]] = ()

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        return self.message


class BudgetExceeded(BudgetError):
    """Admitting the request would take a budget past its limit."""

    code = "budget_exceeded"
    fault = Fault.TENANT_STATE
    shared = False  # rebuilt by the HTTP client without __init__: not on the wire
    period_start: datetime | None = None  # the refusing period (alerts), not on the wire either
    wire = (
        Wire("budget_id", "int", ("budget", "id"), "The budget that refused.", nullable=True),
        Wire("scope", "str", ("budget", "scope"), "Whose budget, e.g. tenant acme."),
        Wire("window", "str", ("budget", "window")),
        Wire(
            "limit",
            "money",
            ("budget", "limit"),
            "Its limit, raises included; null for a tenant's key refused by the installation-wide "
            "budget (other tenants' spend).",
            nullable=True,
        ),
        Wire("remaining", "money", ("budget", "remaining"), nullable=True),
        Wire("currency", "str", ("budget", "currency")),
        Wire("resets_at", "time", ("budget", "resets_at"), "When it has room.", nullable=True),
        Wire("requested", "money", (), "What the request needed."),
        Wire(
            "input_tolerance",
            "money",
            (),
            "Of requested, the input tolerance: the input a commit may report beyond the held "
            "count (10% + 256 tokens), held too so that it cannot add up past the limit.",
        ),
        Wire("tenant", "str", (), "The request's tenant."),
        Wire("end_user", "str", (), "The request's end user, if any."),
    )

    def __init__(
        self,
        *,
        scope: str,
        window: str,
        limit: Decimal,
        remaining: Decimal,
        requested: Decimal,
        resets_at: datetime | None,
        currency: str,
        budget_id: int | None = None,
        tenant: str | None = None,
        end_user: str | None = None,
        shared: bool = False,
        period_start: datetime | None = None,
        prepaid: bool = False,
        top_up_url: str = "",
        input_tolerance: Decimal | None = None,
    ) -> None:
        self.scope = scope
        self.period_start = period_start
        self.window = window
        # The budget counts every tenant's spend: a tenant's key gets ``without_figures``.
        self.shared = shared
        self.limit = limit
        self.remaining = remaining
        self.requested = requested
        self.input_tolerance = input_tolerance
        self.resets_at = resets_at
        self.currency = currency
        self.budget_id = budget_id
        self.tenant = tenant
        self.end_user = end_user
        when = f"resets at {resets_at.isoformat()}" if resets_at else "never resets (lifetime)"
        if resets_at and window.startswith("rolling:"):
            when = f"has room for it at {resets_at.isoformat()}, as older spend leaves the window"
        if self.beyond_limit:
            # Waiting cannot help: say so, and what can (issue 25).
            when = (
                "is larger than the whole limit, so no reset makes room for it: lower its "
                "output ceiling (or its input), or raise the limit"
            )
            if input_tolerance:
                when += " (every call holds its input tolerance: see docs/limits.md)"
        needs = f"this request needs {display(requested)}{self._of_which()}"
        message = (
            f"Budget exceeded: {scope} {window} budget has {display(remaining)} {currency} "
            f"remaining of {display(limit)}; {needs}. It {when}."
        )
        if prepaid:
            # A prepaid balance never resets: only a top-up makes room (billing/credits.py).
            where = f" at {top_up_url}" if top_up_url else ""
            message = (
                f"Budget exceeded: {scope}'s prepaid balance has {display(remaining)} {currency} "
                f"left; {needs}. Top up the balance{where} to continue."
            )
        super().__init__(
            message,
            scope=scope,
            window=window,
            limit=limit,
            remaining=remaining,
            requested=requested,
            resets_at=resets_at,
        )

    def _of_which(self) -> str:
        """What part of ``requested`` the input tolerance is, for the message."""
        if not self.input_tolerance:
            return ""
        return (
            f", of which {display(self.input_tolerance)} is the input tolerance (the input a "
            "commit may report beyond the held count: 10% + 256 tokens)"
        )

    @property
    def beyond_limit(self) -> bool:
        """The request needs more than the budget's whole limit: no reset (nor any wait) can
        admit it, only a smaller request or a higher limit. False for a budget every tenant
        shares (its limit is not the tenant's to learn)."""
        return not self.shared and self.limit is not None and self.requested > self.limit

    def without_figures(self, resets_at: datetime | None) -> dict[str, Any]:
        """What a tenant's key is told of a refusal by a budget every tenant shares: that it
        refused, what the request needed and when to retry (``resets_at``, a bound that says
        nothing of other tenants' spend), never the budget's limit, what remains or its id.
        The attributes to replace, for the REST body."""
        when = f"resets at {resets_at.isoformat()}" if resets_at else "never resets (lifetime)"
        if resets_at and self.window.startswith("rolling:"):
            when = f"has room again by {resets_at.isoformat()} at the latest"
        return {
            "message": (
                f"Budget exceeded: the installation-wide {self.window} budget cannot admit this "
                f"request now; it needs {display(self.requested)} {self.currency}"
                f"{self._of_which()}. It {when}."
            ),
            "limit": None,
            "remaining": None,
            "budget_id": None,
            "resets_at": resets_at,
        }

    @property
    def retry_after(self) -> int | None:
        """Whole seconds until the budget resets, or None for a lifetime budget."""
        if self.resets_at is None:
            return None
        # Aware arithmetic without django.utils.timezone, so the HTTP client works without Django
        # settings (it rebuilds these errors from JSON).
        seconds = (self.resets_at - datetime.now(UTC)).total_seconds()
        return max(1, int(seconds) + (0 if seconds == int(seconds) else 1))


class UnknownPrice(BudgetError, LookupError):
    """No price is in effect for the model, so the worst case cannot be priced."""

    code = "unknown_price"
    fault = Fault.TENANT_STATE
    wire = (
        Wire("provider", help="The provider asked for, if any."),
        Wire("model", help="The model that has no price in effect."),
        Wire("policy", help="The plan's unknown-model policy, when it could not price it."),
    )

    def __init__(
        self,
        *,
        provider: str | None,
        model: str,
        policy: str | None = None,
        service_tier: str | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.policy = policy
        name = f"{provider}/{model}" if provider else f"{model} (from any provider)"
        why = f" and the plan's unknown-model policy ({policy}) cannot price it" if policy else ""
        fix = (
            f'Set one with budgets.set_price(provider=..., model="{model}", ...), import the '
            "catalogue with `manage.py llm_budgets_sync_prices`, or give the tenant's plan an "
            "unknown-model policy (reserve_fixed or price_as)."
        )
        if service_tier:
            # A billing modifier (docs/pricing.md, "Billing modifiers"): never charged standard.
            name = f"{name} at service tier {service_tier!r}"
            fix = (
                f"Give the model's price rates for {service_tier!r} (service_tiers), or the "
                f"provider a multiplier for it in LLM_BUDGETS['SERVICE_TIER_MULTIPLIERS']."
            )
        super().__init__(
            f"No price is in effect for {name}{why}, so the call cannot be admitted "
            f"(an unpriced model is never treated as free). {fix}",
            provider=provider,
            model=model,
            policy=policy,
        )


class OutputCeilingRequired(BudgetError, ValueError):
    """The request has no ``max_output_tokens`` and its plan sets no default."""

    code = "output_ceiling_required"
    fault = Fault.CALLER

    def __init__(self) -> None:
        super().__init__(
            "max_output_tokens is required: without an output ceiling the worst-case cost is "
            "unbounded. Pass max_output_tokens, or set default_max_output_tokens on the plan."
        )


class InvalidUsage(BudgetError, ValueError):
    """An argument is missing, of the wrong type or out of range; ``field`` names it."""

    code = "invalid"
    fault = Fault.CALLER
    wire: ClassVar[tuple[Wire, ...]] = (Wire("field", help="The bad field, when one is."),)

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message, field=field)


class UsageExceedsHold(InvalidUsage):
    """A commit reports usage its hold could not have produced (more output than the ceiling the
    call was sent with, and the like: ``llm_budgets.usage.usage_within_hold``). Nothing was
    recorded; the hold stays open for a correct commit."""

    code = "usage_exceeds_hold"
    fault = Fault.CALLER
    wire = (
        *InvalidUsage.wire,
        Wire("reservation_id", help="The hold the commit was for."),
        Wire("reported", "int", help="What the commit reported in that field."),
        Wire("allowed", "int", help="The most the hold admits in that field."),
    )

    def __init__(
        self, message: str, *, field: str, reservation_id: str, reported: int, allowed: int
    ) -> None:
        self.reservation_id = reservation_id
        self.reported = reported
        self.allowed = allowed
        super().__init__(message, field=field)
        self.context.update(reservation_id=reservation_id, reported=reported, allowed=allowed)


class UnknownTenant(InvalidUsage, LookupError):
    """No tenant has that external id."""

    code = "unknown_tenant"
    fault = Fault.CALLER
    wire = (*InvalidUsage.wire, Wire("external_id", help="The tenant id that is unknown."))

    def __init__(self, external_id: str) -> None:
        self.external_id = external_id
        super().__init__(
            f"No tenant has external_id {external_id!r}. "
            f'Create it first with budgets.ensure_tenant(tenant="{external_id}", ...).',
            field="tenant",
        )


class ConfigurationUncommitted(InvalidUsage):
    """A call was admitted inside the open transaction that created or changed its tenant's
    configuration (the tenant, its plan, budgets, raises or prices). The ledger commits on its
    own connection, which sees neither that configuration nor past its row locks until the
    transaction commits, so the call is refused at once rather than admitted against the old
    configuration or left waiting on the caller's own locks. Nothing was held."""

    code = "configuration_uncommitted"
    fault = Fault.CALLER

    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"Tenant {tenant!r}'s llm_budgets configuration was created or changed in the "
            "transaction this call runs in, which has not committed yet: the ledger commits "
            "on its own connection and cannot see it. Nothing was held. Admit the call after "
            "the transaction commits (transaction.on_commit, or outside the atomic block).",
            field="tenant",
        )


class SelfServeDenied(BudgetError, PermissionError):
    """A tenant admin (the pages, a self-serve key) asked for what the operators do not allow:
    self-serve is off for the tenant, the host hid the action, the person is a member, the
    target is another tenant's, or the amount is above the ceiling. ``field`` names the input
    to change, when one is."""

    code = "self_serve_denied"
    fault = Fault.TENANT_STATE
    wire: ClassVar[tuple[Wire, ...]] = (
        Wire("action", help="The self-serve action refused, e.g. budgets."),
        Wire("field", help="The input to change, when one is."),
    )

    def __init__(self, message: str, *, action: str, field: str | None = None) -> None:
        self.action = action
        self.field = field
        super().__init__(message, action=action, field=field)


class NoApplicableBudget(InvalidUsage):
    """No budget covers the request: admitting it would spend without any cap."""

    code = "no_budget"
    fault = Fault.TENANT_STATE

    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"No budget applies to tenant {tenant!r}, so the call would be uncapped and was "
            'refused. Set one, e.g. budgets.set_limit(amount=Decimal("1000"), window="month") '
            "for a global cap.",
            field="tenant",
        )


class RunClosed(BudgetError):
    """The run the call names was closed (``budgets.close_run``): its lifetime has ended."""

    code = "run_closed"
    fault = Fault.TENANT_STATE
    wire = (
        Wire("tenant", help="The run's tenant."),
        Wire("run", help="The run that was closed."),
        Wire("closed_at", "time", help="When it was closed."),
    )

    def __init__(self, *, tenant: str, run: str, closed_at: datetime) -> None:
        self.tenant = tenant
        self.run = run
        self.closed_at = closed_at
        super().__init__(
            f"Run {run} of {tenant} was closed at {closed_at.isoformat()}; its budget's "
            "lifetime has ended, so no more calls are admitted for it. Start a new run "
            "(a new run id) to continue.",
            tenant=tenant,
            run=run,
            closed_at=closed_at,
        )


class NewIdCapped(BudgetError):
    """The call names an end user or run the tenant has not used before, and the tenant's calls
    already brought in as many new ones in the last 24 hours as ``NEW_END_USERS_PER_DAY`` /
    ``NEW_RUNS_PER_DAY`` allow. Nothing was held or created; ids seen before still run."""

    code = "new_id_capped"
    fault = Fault.TENANT_STATE
    wire = (
        Wire("tenant", help="The request's tenant."),
        Wire("kind", help="end_user or run: which kind of id was new."),
        Wire("new_id", help="The new id the call named."),
        Wire("cap", "int", help="New ids of that kind a tenant may bring in per 24 hours."),
        Wire("retry_after", "int", help="Seconds until the oldest of them leaves the 24 hours."),
    )

    def __init__(self, *, tenant: str, kind: str, new_id: str, cap: int, retry_after: int) -> None:
        self.tenant = tenant
        self.kind = kind
        self.new_id = new_id
        self.cap = cap
        self.retry_after = retry_after
        setting = "NEW_END_USERS_PER_DAY" if kind == "end_user" else "NEW_RUNS_PER_DAY"
        noun = "end users" if kind == "end_user" else "runs"
        super().__init__(
            f"Tenant {tenant} has brought in {cap} new {noun} in the last 24 hours, the most "
            f"LLM_BUDGETS[{setting!r}] allows, and {kind.replace('_', ' ')} {new_id!r} is new: "
            f"the call was refused and nothing was created. Calls for {noun} seen before still "
            f"run; retry in {retry_after} seconds, or ask the operator to raise the cap.",
            tenant=tenant,
            kind=kind,
            new_id=new_id,
            cap=cap,
            retry_after=retry_after,
        )


class IdempotencyKeyReused(BudgetError):
    """The idempotency key was already used for a different request in this tenant: a retry
    must repeat the request it retries. Nothing was held."""

    code = "idempotency_key_reused"
    fault = Fault.CALLER
    wire = (
        Wire("idempotency_key", help="The key, used before for another request."),
        Wire("reservation_id", help="The reservation the key belongs to."),
        Wire("differs", help="The request's fields that differ from that reservation's."),
    )

    def __init__(self, *, idempotency_key: str, reservation_id: str, differs: str) -> None:
        self.idempotency_key = idempotency_key
        self.reservation_id = reservation_id
        self.differs = differs
        super().__init__(
            f"Idempotency key {idempotency_key!r} was already used for reservation "
            f"{reservation_id}, a different request ({differs} differ). A retry must repeat its "
            "request exactly; use a new key for a new request.",
            idempotency_key=idempotency_key,
            reservation_id=reservation_id,
            differs=differs,
        )


class ReservationNotFound(BudgetError, LookupError):
    """No reservation has that id."""

    code = "reservation_not_found"
    fault = Fault.CALLER

    def __init__(self, reservation_id: object) -> None:
        self.reservation_id = reservation_id
        super().__init__(f"No reservation has id {reservation_id}.")


class ReservationStateError(BudgetError):
    """The reservation's state does not allow the operation (e.g. commit after release)."""

    code = "reservation_state"
    fault = Fault.CALLER
    wire = (Wire("state", help="The reservation's state, which does not allow this."),)

    def __init__(self, message: str, *, state: str) -> None:
        self.state = state
        super().__init__(message, state=state)


class LedgerUnavailable(BudgetError):
    """The ledger could not be read or written in time; the call is refused (fail closed). The
    message says what the refused action may have left behind: for a settlement the outcome is
    unknown (the database may have committed before its answer was lost; retrying the same
    request is safe, settlements are idempotent); for an admission a hold may have been taken
    the same way (retry with the same idempotency key to get it back rather than hold twice)."""

    code = "ledger_unavailable"
    fault = Fault.DEPENDENCY
    wire = (Wire("retry_after", "int", help="Seconds to wait before retrying."),)
    retry_after: int = 1

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        self.retry_after = retry_after
        super().__init__(message, retry_after=retry_after)


class KillSwitchActive(BudgetError):
    """A kill switch covers the request: nothing in its scope is admitted until it is cleared."""

    code = "kill_switch_active"
    fault = Fault.TENANT_STATE
    wire = (
        Wire("switch_id", "int", help="The kill switch that refused."),
        Wire("scope", help="What it stops, e.g. tenant acme, model gpt-4o."),
        Wire("reason", help="Why it was tripped."),
        Wire("tripped_by"),
        Wire("tripped_at", "time"),
        Wire("automatic", "bool", help="Tripped by an anomaly detector."),
        Wire("tenant", help="The request's tenant."),
        Wire("end_user", help="The request's end user, if any."),
        Wire("model", help="The model the request asked for."),
    )

    def __init__(
        self,
        *,
        switch_id: int,
        scope: str,
        reason: str,
        tripped_by: str,
        tripped_at: datetime,
        automatic: bool,
        tenant: str | None = None,
        end_user: str | None = None,
        model: str | None = None,
    ) -> None:
        self.switch_id = switch_id
        self.scope = scope
        self.reason = reason
        self.tripped_by = tripped_by
        self.tripped_at = tripped_at
        self.automatic = automatic
        self.tenant = tenant
        self.end_user = end_user
        self.model = model
        who = tripped_by or ("an automatic detector" if automatic else "someone unnamed")
        super().__init__(
            f"Kill switch on {scope} refused the call: {reason} "
            f"(tripped by {who} at {clock.when(tripped_at, None)}). "
            "It stays until a person clears it.",
            switch_id=switch_id,
            scope=scope,
            reason=reason,
            tripped_by=tripped_by,
            tripped_at=tripped_at,
            automatic=automatic,
        )


class NoBalance(InvalidUsage):
    """The tenant has no prepaid balance: open one first (``billing.credits.balance_open``)."""

    code = "no_balance"
    fault = Fault.TENANT_STATE


class NotLinked(InvalidUsage):
    """The tenant has no Stripe customer to charge or grant credit to."""

    code = "not_linked"
    fault = Fault.TENANT_STATE


class PaymentProviderError(BudgetError):
    """Stripe refused or could not be reached during a top-up or a credit grant; nothing was
    charged or credited. A dependency's fault, not the request's: the same request may succeed
    later (``retry_after``)."""

    code = "payment_provider_error"
    fault = Fault.DEPENDENCY
    wire = (Wire("retry_after", "int", help="Seconds to wait before retrying."),)
    retry_after: int = 10  # Stripe's own retries back off over seconds, not milliseconds

    def __init__(self, message: str, *, retry_after: int = 10) -> None:
        self.retry_after = retry_after
        super().__init__(message, retry_after=retry_after)
