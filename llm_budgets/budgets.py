"""The public Python API: ``from llm_budgets import budgets``.

Thin by design: each function validates nothing itself and calls one service. See the README's
five-minute tour.

Async twins (Django's convention: ``aget`` beside ``get``): ``areserve``, ``acommit``, ... and on a
hold ``acommit``, ``arelease``, ... each run its sync function in Django's thread-sensitive worker
(``asgiref.sync.sync_to_async``), so each rule keeps one implementation; ``async with
budgets.areserve(...) as hold:`` leaves its block by the with-block policy
(``llm_budgets.holds``). The thread and connection model: docs/async.md.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Coroutine
from datetime import datetime
from decimal import Decimal
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from asgiref.sync import sync_to_async
from django.utils import timezone

from llm_budgets.control import killswitches, limits
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.engine import admission, settlement
from llm_budgets.engine.applicable import scopes_for_read
from llm_budgets.engine.settlement import CommitResult
from llm_budgets.holds import Admission, AsyncHoldPolicy, HoldPolicy, ttl_renamed
from llm_budgets.models import (
    EndUser,
    KillSwitch,
    Reservation,
    Run,
    StripeCustomerLink,
    Tenant,
)
from llm_budgets.pricing import prices as pricing
from llm_budgets.reads import explain as explanations
from llm_budgets.reads import quotes
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.request import Request
from llm_budgets.results import (
    BudgetResult,
    BudgetStatus,
    ClosedRun,
    Explanation,
    HoldState,
    KillSwitchResult,
    PriceResult,
    Quote,
    StripeLinkResult,
    TenantResult,
    hold_state,
)
from llm_budgets.tenancy import runs, tenants
from llm_budgets.usage import Usage, usage_keywords

logger = logging.getLogger("llm_budgets")

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "CommitResult",
    "Hold",
    "Quote",
    "Usage",
    "aclear",
    "aclose_run",
    "acommit",
    "aexplain",
    "aextend",
    "aget",
    "amark_uncertain",
    "aquote",
    "arelease",
    "areserve",
    "astatus",
    "atrip",
    "clear",
    "close_run",
    "commit",
    "ensure_tenant",
    "explain",
    "extend",
    "get",
    "link_stripe_customer",
    "mark_uncertain",
    "quote",
    "release",
    "reserve",
    "set_limit",
    "set_price",
    "status",
    "sweep",
    "trip",
    "unlink_stripe_customer",
]


def _twin(function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """The async twin of ``function``: the same parameters, awaited; the call runs ``function``
    itself in Django's thread-sensitive worker (one implementation of each rule)."""
    run = sync_to_async(function, thread_sensitive=True)

    @functools.wraps(function)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> T:
        return await run(*args, **kwargs)

    _named_twin(twin, function)
    return twin


def _named_twin(twin: Callable[..., Any], function: Callable[..., Any]) -> None:
    owner, dot, _ = function.__qualname__.rpartition(".")
    twin.__name__ = "a" + function.__name__
    twin.__qualname__ = owner + dot + twin.__name__
    twin.__doc__ = (
        f"``await`` twin of ``{function.__name__}`` (same parameters, same result), run in "
        "Django's thread-sensitive worker (docs/async.md).\n\n" + (function.__doc__ or "")
    )


class Hold(HoldPolicy, AsyncHoldPolicy):
    """A reservation as the caller sees it. Use it as a context manager to never leak it.

    Inside ``with budgets.reserve(...) as hold:`` an exception releases the hold, except a
    ``TimeoutError``: a timeout is no proof the provider stopped, so the hold is marked UNCERTAIN
    and stays counted until usage arrives or the reconcile job settles it. Leaving the block
    without commit or release raises ``ReservationStateError`` and leaves the hold to expire
    (charged as estimated), for the same reason. The policy is ``llm_budgets.holds.HoldPolicy``,
    shared with the client's ``RemoteHold``.
    """

    def __init__(self, reservation: Reservation) -> None:
        self._reservation = reservation
        self._result: CommitResult | None = None

    def __repr__(self) -> str:
        return f"<Hold {self.id} {self.amount} {self.currency} {self.state}>"

    @property
    def id(self) -> UUID:
        return self._reservation.pk

    @property
    def amount(self) -> Decimal:
        return self._reservation.amount

    @property
    def currency(self) -> str:
        return self._reservation.currency

    @property
    def expires_at(self) -> datetime:
        return self._reservation.expires_at

    @property
    def state(self) -> HoldState:
        return hold_state(self._reservation.state)

    @property
    def model(self) -> str:
        return self._reservation.model

    @property
    def max_output_tokens(self) -> int:
        return self._reservation.max_output_tokens

    @property
    def degraded(self) -> bool:
        """Whether the degradation ladder granted less than was asked (see ``requested_model``)."""
        return self._reservation.degraded

    @property
    def requested_model(self) -> str:
        return self._reservation.requested_model or self._reservation.model

    @property
    def reservation(self) -> Reservation:
        return self._reservation

    def commit(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        reasoning_tokens: int = 0,
        tool_calls: dict[str, int] | None = None,
        usage: Usage | None = None,
    ) -> CommitResult:
        """Charge actual usage; returns ``cost`` and ``overage``. Idempotent. Give the counts
        (the public convention: ``input_tokens`` includes cache reads and writes; see
        ``llm_budgets.usage``) or ``usage=llm_budgets.usage.from_anthropic(response.usage)``."""
        self._result = settlement.reservation_commit(
            self.id, **usage_keywords(locals()), usage=usage
        )
        self._reservation.state = self._result.state
        return self._result

    def release(self) -> HoldState:
        """Drop the hold (the call produced nothing). Returns the final state."""
        self._reservation.state = settlement.reservation_release(self.id)
        return self.state

    def mark_uncertain(self) -> HoldState:
        """The call's outcome is unknown: keep the hold counted until usage arrives or the
        reconcile job settles it (``UNCERTAIN_SETTLE_RULE``). Returns the state."""
        self._reservation.state = settlement.reservation_mark_uncertain(self.id)
        return self.state

    def extend(self, *, ttl: int | None = None, ttl_seconds: int | None = None) -> Hold:
        """Push the expiry to ``ttl`` seconds from now (never earlier), for a call that runs
        longer than planned. Only a held reservation can be extended. (``ttl_seconds``: the old
        name, deprecated.)"""
        seconds = ttl_renamed(ttl, ttl_seconds, where="extend")
        self._reservation = settlement.reservation_extend(self.id, ttl=seconds)
        return self

    def refresh(self) -> Hold:
        self._reservation.refresh_from_db()
        return self

    # The async twins (``await hold.acommit(...)``; ``async with`` leaves by the same policy).
    acommit = _twin(commit)
    aextend = _twin(extend)
    arefresh = _twin(refresh)

    async def arelease(self) -> HoldState:
        """``await`` twin of ``release``."""
        return await sync_to_async(self.release, thread_sensitive=True)()

    async def amark_uncertain(self) -> HoldState:
        """``await`` twin of ``mark_uncertain``."""
        return await sync_to_async(self.mark_uncertain, thread_sensitive=True)()


@ledger_guard("prices")
def set_price(
    *,
    provider: str,
    model: str,
    input_per_mtok: Decimal | int | str,
    output_per_mtok: Decimal | int | str,
    effective_from: datetime | None = None,
    actor: str = "",
    **fields: Any,
) -> PriceResult:
    """Add a price version for (provider, model), in effect from ``effective_from`` (now).

    Other ``fields``: ``cached_input_per_mtok``, ``cache_write_per_mtok``,
    ``cache_write_1h_per_mtok``, ``reasoning_per_mtok``, ``per_request``, ``tool_fees``,
    ``tiers``, ``daily_spans``, ``max_output_tokens``, ``context_window`` (docs/pricing.md)."""
    price = pricing.price_set(
        provider=provider,
        model=model,
        input_per_mtok=input_per_mtok,
        output_per_mtok=output_per_mtok,
        effective_from=effective_from,
        actor=actor,
        **fields,
    )
    return pricing.price_result(price)


@ledger_guard("tenants")
def ensure_tenant(
    external_id: str | None = None,
    /,
    *,
    tenant: str | None = None,
    name: str | None = None,
    timezone: str | None = None,
    billing_day: int | None = None,
    plan: str | None = None,
    billing_emails: str | None = None,
    markup_percent: Decimal | int | str | None = None,
) -> TenantResult:
    """Create the tenant, or update the fields given (``markup_percent`` overrides the plan's
    markup for customer prices; ``billing_emails``: who gets budget warnings, separated by
    commas or new lines). The tenant's external id is ``tenant=``, as in every other function
    (given positionally it still works, with a ``DeprecationWarning``, for one release)."""
    if external_id is not None:
        if tenant is not None:
            raise TypeError("ensure_tenant() takes tenant=, not also a positional tenant.")
        warnings.warn(
            "ensure_tenant(external_id, ...) is deprecated: write ensure_tenant(tenant=...), as "
            "every other function takes it. The positional form goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        tenant = external_id
    if tenant is None:
        raise TypeError("ensure_tenant() missing required keyword argument: 'tenant'")
    obj = tenants.tenant_ensure(
        tenant,
        name=name,
        timezone=timezone,
        billing_day=billing_day,
        plan=plan,
        billing_emails=billing_emails,
        markup_percent=markup_percent,
    )
    return TenantResult(
        id=obj.pk,
        external_id=obj.external_id,
        name=obj.name,
        plan=obj.plan.name if obj.plan is not None else None,
        timezone=obj.timezone,
        billing_day=obj.billing_day,
        billing_emails=obj.billing_emails,
        markup_percent=obj.markup_percent,
    )


@ledger_guard("limits")
def set_limit(
    *,
    amount: Decimal | int | str,
    window: str,
    tenant: str | None = None,
    end_user: str | None = None,
    actor: str = "",
    reason: str = "",
    unit: str | None = None,
    api_key: str | None = None,
    run: str | None = None,
    tag: tuple[str, str] | None = None,
    hot: bool | None = None,
    stripes: int | None = None,
) -> BudgetResult:
    """Create or change a budget: global (no tenant), a tenant, each of its end users (``"*"``),
    or one end user; with a tenant, an API key (its prefix, or ``"*"`` for each key), a run
    (``"*"`` for each run) or a tag (``("project", "alpha")``). ``unit``: ``provider_cost``
    (default) or ``customer_price``. ``hot=True``: split its counter into ``stripes`` (default
    8) so admissions under it do not all lock one row (docs/limits.md, "Hot caps")."""
    budget = limits.budget_set_limit(
        amount=amount,
        window=window,
        tenant=tenant,
        end_user=end_user,
        actor=actor,
        reason=reason,
        unit=unit,
        api_key=api_key,
        run=run,
        tag=tag,
        hot=hot,
        stripes=stripes,
    )
    return BudgetResult(
        id=budget.pk,
        scope=str(budget.scope),
        scope_label=budget.scope_label,
        tenant=budget.tenant.external_id if budget.tenant else None,
        end_user=budget.end_user.external_id if budget.end_user else None,
        window=str(budget.window),
        limit=budget.limit,
        currency=budget.currency,
        unit=str(budget.unit),
        hot=budget.hot,
        stripes=budget.stripes,
    )


@ledger_guard("runs")
def close_run(*, tenant: str, run: str, actor: str = "", reason: str = "") -> ClosedRun:
    """Close a run: its lifetime budgets end, and later reservations naming it are refused
    (``RunClosed``). Holds already taken settle as usual. Returns the run and when it was
    closed (the first close's time if it was closed already)."""
    closed = runs.run_close(tenant=tenant, run=run, actor=actor, reason=reason)
    return ClosedRun(
        tenant=closed.tenant.external_id,
        run=closed.external_id,
        closed_at=closed.closed_at or timezone.now(),  # run_close always sets it
    )


def reserve(
    *,
    tenant: str,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    end_user: str | None = None,
    provider: str | None = None,
    idempotency_key: str | None = None,
    ttl: int | None = None,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | None = None,
    max_tool_calls: dict[str, int] | None = None,
    allow_degrade: bool = False,
    tags: dict[str, str] | None = None,
    run: str | None = None,
) -> Hold:
    """Admit a call and hold its worst-case cost, or raise a ``BudgetError`` that says why.

    ``max_tool_calls`` (e.g. ``{"web_search": 3}``) adds those tools' fees to the hold.
    ``tags`` (e.g. ``{"feature": "chat"}``, at most 16 string pairs) are kept on the
    reservation and copied onto its ledger lines; the budgets of each tag apply.
    ``run`` (e.g. ``"run-42"``) names the agent run the call belongs to: its budgets (and the
    tenant's ``run="*"`` budget, on the run's own counter) apply, until ``close_run``.

    Give ``input_tokens`` (all input, cached included), or ``messages`` / ``prompt`` to have
    them counted offline (docs/pricing.md). ``provider`` may be left out when exactly one
    provider prices ``model``. With ``allow_degrade=True`` the plan's degradation ladder may
    grant a cheaper model or a lower output ceiling: call the provider with ``hold.model`` and
    ``hold.max_output_tokens``."""
    return Hold(admission.reservation_admit(Request.from_arguments(locals())))


@ledger_guard("quote")
def quote(
    *,
    tenant: str,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    provider: str | None = None,
    end_user: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | None = None,
    ttl: int | None = None,
    max_tool_calls: dict[str, int] | None = None,
    run: str | None = None,
    tags: dict[str, str] | None = None,
) -> Quote:
    """Explain a price without holding anything: the itemised worst case, the price version (or
    the unknown-model policy) and the budgets the request would draw on (with the run's and
    the tags' own). Takes what ``reserve`` takes, but ``idempotency_key`` and ``allow_degrade``
    (a quote holds nothing)."""
    return quotes.request_quote(Request.from_arguments(locals()))


def commit(
    hold_id: UUID | str,
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cached_input_tokens: int = 0,
    cache_write_tokens: int = 0,
    cache_write_1h_tokens: int = 0,
    reasoning_tokens: int = 0,
    tool_calls: dict[str, int] | None = None,
    usage: Usage | None = None,
) -> CommitResult:
    """Commit a reservation by id (e.g. from another process); counts as in ``Hold.commit``."""
    return settlement.reservation_commit(hold_id, **usage_keywords(locals()), usage=usage)


def release(hold_id: UUID | str) -> HoldState:
    """Release a reservation by id. Returns its final state."""
    return hold_state(settlement.reservation_release(hold_id))


def extend(hold_id: UUID | str, *, ttl: int | None = None, ttl_seconds: int | None = None) -> Hold:
    """Push a held reservation's expiry to ``ttl`` seconds from now (never earlier), by id.
    (``ttl_seconds``: the old name, deprecated.)"""
    seconds = ttl_renamed(ttl, ttl_seconds, where="extend")
    return Hold(settlement.reservation_extend(hold_id, ttl=seconds))


def get(hold_id: UUID | str) -> Hold:
    """A reservation by id, e.g. to settle it from another process."""
    return Hold(settlement.reservation_get(hold_id))


def mark_uncertain(hold_id: UUID | str) -> HoldState:
    """The call's outcome is unknown (by id, e.g. from a watchdog): keep its hold counted until
    usage arrives or the reconcile job settles it. Returns the state."""
    return hold_state(settlement.reservation_mark_uncertain(hold_id))


@ledger_guard("status")
def status(
    *,
    tenant: str,
    end_user: str | None = None,
    run: str | None = None,
    tags: dict[str, str] | None = None,
) -> list[BudgetStatus]:
    """Every budget that applies to the tenant (and end user, run and tags): limit, spent,
    reserved, remaining, period start and ``resets_at``."""
    tenant_obj = tenants.tenant_get(tenant)
    user_obj = None
    if end_user is not None:
        user_obj = tenant_obj.end_users.filter(external_id=end_user).first()
        if user_obj is None:
            # Not seen yet: show the defaults it would get, without creating it.
            user_obj = EndUser(tenant=tenant_obj, external_id=end_user)
    scopes = scopes_for_read(tenant_obj, run=run, tags=tags)
    return budget_statuses(tenant_obj, user_obj, timezone.now(), scopes)


@ledger_guard("kill switch trip")
def trip(
    *,
    tenant: str | None = None,
    end_user: str | None = None,
    provider: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    reason: str,
    actor: str = "",
    auto_clear_at: datetime | None = None,
    run: str | None = None,
) -> KillSwitchResult:
    """Stop every admission in a scope now. No scope: global; several: their intersection (e.g.
    one model for one tenant). Stays until ``clear`` (or ``auto_clear_at``, if given). ``reason``
    is required (``InvalidUsage`` without one). ``api_key`` (a REST API key's prefix) limits it to
    calls made through that key; ``run`` (with a tenant) to calls naming that run."""
    scope = killswitches.switch_scope(
        tenant=tenant, end_user=end_user, provider=provider, model=model, api_key=api_key, run=run
    )
    assert scope is not None  # end users are created on trip
    return _switch_result(
        killswitches.kill_switch_trip(
            scope=scope, reason=reason, actor=actor, auto_clear_at=auto_clear_at
        )
    )


@ledger_guard("kill switch clear")
def clear(
    *,
    tenant: str | None = None,
    end_user: str | None = None,
    provider: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    reason: str,
    actor: str = "",
    run: str | None = None,
) -> KillSwitchResult:
    """Clear the switch tripped on exactly this scope. ``InvalidUsage`` if none is tripped.
    ``reason`` is required (``InvalidUsage`` if blank)."""
    scope = killswitches.switch_scope(
        tenant=tenant,
        end_user=end_user,
        provider=provider,
        model=model,
        api_key=api_key,
        run=run,
        create_end_user=False,
    )
    return _switch_result(killswitches.kill_switch_clear(scope=scope, reason=reason, actor=actor))


def _switch_result(switch: KillSwitch) -> KillSwitchResult:
    """A switch as the REST API shows it (``api.killswitches.KillSwitchSerializer``)."""

    def external_id(obj: Tenant | EndUser | Run | None) -> str | None:
        return obj.external_id if obj is not None else None

    return KillSwitchResult(
        id=switch.pk,
        scope=switch.scope_label,
        tenant=external_id(switch.tenant),
        end_user=external_id(switch.end_user),
        provider=switch.provider,
        model=switch.model,
        api_key=switch.api_key.prefix if switch.api_key else None,
        run=external_id(switch.run),
        active=killswitches.switch_is_open(switch, timezone.now()),
        reason=switch.reason,
        tripped_by=switch.tripped_by,
        tripped_at=switch.tripped_at,
        automatic=switch.automatic,
        detector=switch.detector,
        auto_clear_at=switch.auto_clear_at,
        cleared_at=switch.cleared_at,
        cleared_by=switch.cleared_by,
        clear_reason=switch.clear_reason,
    )


@ledger_guard("explain")
def explain(
    *,
    tenant: str,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    provider: str | None = None,
    end_user: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | None = None,
    ttl: int | None = None,
    max_tool_calls: dict[str, int] | None = None,
    run: str | None = None,
    tags: dict[str, str] | None = None,
) -> Explanation:
    """Every budget and kill switch that applies to this would-be request, with its state and
    whether the request would fit. Holds nothing. Takes what ``quote`` takes: what ``reserve``
    takes, but ``idempotency_key`` and ``allow_degrade``."""
    return explanations.request_explain(Request.from_arguments(locals()))


def sweep(*, now: datetime | None = None, batch_size: int = settlement.SWEEP_BATCH) -> int:
    """Expire overdue holds (see ``EXPIRED_HOLD_POLICY``), ``batch_size`` at a time. Returns how
    many expired. ``now``: the instant to expire at (tests, replaying a sweep); by default the
    database's clock."""
    return settlement.reservations_sweep(now=now, batch_size=batch_size)


@ledger_guard("stripe link")
def link_stripe_customer(*, tenant: str, customer_id: str, actor: str = "") -> StripeLinkResult:
    """Bill the tenant's usage to a Stripe customer (``cus_...``), from now on and for its unsent
    usage of the last 35 days; relinking moves unsent usage to the new customer. Audited.
    Returns the link (docs/billing.md)."""
    from llm_budgets.billing.links import stripe_customer_link

    return _link_result(stripe_customer_link(tenant=tenant, customer_id=customer_id, actor=actor))


@ledger_guard("stripe link")
def unlink_stripe_customer(*, tenant: str, reason: str = "", actor: str = "") -> StripeLinkResult:
    """Stop delivering the tenant's new usage to Stripe; what is already owed is still delivered.
    ``InvalidUsage`` if it is not linked. Audited."""
    from llm_budgets.billing.links import stripe_customer_unlink

    return _link_result(stripe_customer_unlink(tenant=tenant, reason=reason, actor=actor))


def _link_result(link: StripeCustomerLink) -> StripeLinkResult:
    return StripeLinkResult(
        tenant=link.tenant.external_id,
        customer_id=link.customer_id,
        linked_at=link.linked_at,
        linked_by=link.linked_by,
        unlinked_at=link.unlinked_at,
        unlink_reason=link.unlink_reason,
    )


# The async twins of the functions above (``await budgets.astatus(...)``). ``areserve`` returns
# an ``Admission``: ``await`` it for the hold, or ``async with budgets.areserve(...) as hold:``.


def _admitting(function: Callable[P, Hold]) -> Callable[P, Admission[Hold]]:
    run = sync_to_async(function, thread_sensitive=True)

    @functools.wraps(function)
    def twin(*args: P.args, **kwargs: P.kwargs) -> Admission[Hold]:
        return Admission(lambda: run(*args, **kwargs))

    _named_twin(twin, function)
    return twin


areserve = _admitting(reserve)
acommit = _twin(commit)
arelease = _twin(release)
aextend = _twin(extend)
aget = _twin(get)
amark_uncertain = _twin(mark_uncertain)
astatus = _twin(status)
aquote = _twin(quote)
aexplain = _twin(explain)
aclose_run = _twin(close_run)
atrip = _twin(trip)
aclear = _twin(clear)
