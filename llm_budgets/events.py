"""One structured log line per operational event, with stable field names (docs/operations.md).

Every line goes to the ``llm_budgets.events`` logger. Its message reads ``<event> key=value ...``
for plain-text logs; the same fields are attributes of the ``LogRecord`` (``record.event``,
``record.tenant``...), which :class:`llm_budgets.logformat.JsonFormatter` (or any JSON formatter
that copies extra attributes) writes as top-level keys. Field names never change meaning; new
fields may be added.

Events: ``admission.refused``, ``kill_switch.tripped``, ``kill_switch.cleared``, ``hold.expired``,
``settlement.failed``, ``sweep.finished``, ``guard.underestimate``.

The decorators below wrap the engine's entry points (one line each there): they time the call for
the metrics (:mod:`llm_budgets.metrics`, a no-op without ``prometheus_client``) and log the
outcome. They never change what the wrapped function returns or raises.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeVar, cast

from llm_budgets import metrics
from llm_budgets.exceptions import BudgetError, BudgetExceeded, KillSwitchActive
from llm_budgets.metrics import scope_kind

logger = logging.getLogger("llm_budgets.events")

F = TypeVar("F", bound=Callable[..., Any])

FIELDS = (
    "event",  # what happened: admission.refused, kill_switch.tripped, ...
    "reason",  # machine code of a refusal or error: budget_exceeded, kill_switch_active, ...
    "tenant",  # tenant external id
    "end_user",  # end user external id
    "scope",  # the budget's or switch's scope as a person reads it ("tenant acme")
    "scope_kind",  # global, tenant, end_user, provider, model, api_key, other, none
    "window",  # budget window (month, day, rolling:3600, ...)
    "budget_id",
    "limit",  # Decimal amounts as strings, in `currency`
    "remaining",
    "requested",
    "currency",
    "retry_after",  # seconds
    "switch_id",
    "automatic",  # tripped by a detector
    "detector",
    "actor",  # who tripped or cleared a switch
    "reservation_id",
    "action",  # settlement action: commit, release, extend, uncertain
    "error",  # the error's message
    "detail",  # human text: a kill switch's reason
    "expired",  # sweep: holds expired in this run
    "duration_ms",
    "held",  # guard.underestimate: the hold's amount and what the provider billed, in `currency`
    "cost",
)
"""The documented field names, in the order a plain-text line shows them."""

_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
assert not _RESERVED & set(FIELDS), "a field name would clash with a LogRecord attribute"


def event_log(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event line; fields that are None are left out."""
    if not logger.isEnabledFor(level):
        return
    values = {k: _plain(v) for k, v in fields.items() if v is not None}
    text = " ".join(f"{k}={_quote(v)}" for k, v in values.items())
    logger.log(level, "%s %s", event, text, extra={"event": event, **values})


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _quote(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text or '"' in text) else text


def refusal_fields(exc: BudgetError) -> dict[str, Any]:
    """The fields of a refusal's log line (and of nothing tenant-specific in metrics)."""
    fields: dict[str, Any] = {"reason": exc.code}
    if isinstance(exc, BudgetExceeded):
        fields.update(
            tenant=exc.tenant,
            end_user=exc.end_user,
            scope=exc.scope,
            scope_kind=scope_kind(exc.scope),
            window=exc.window,
            budget_id=exc.budget_id,
            limit=exc.limit,
            remaining=exc.remaining,
            requested=exc.requested,
            currency=exc.currency,
            retry_after=exc.retry_after,
        )
    elif isinstance(exc, KillSwitchActive):
        fields.update(
            tenant=exc.tenant,
            end_user=exc.end_user,
            scope=exc.scope,
            scope_kind=scope_kind(exc.scope),
            switch_id=exc.switch_id,
            automatic=exc.automatic,
        )
    else:
        fields.update(
            scope_kind="none",
            retry_after=getattr(exc, "retry_after", None),
            error=exc.message,
        )
    return fields


def observed_admission(function: F) -> F:
    """Wrap ``reservation_admit``: time it, count it, log a refusal."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            result = function(*args, **kwargs)
        except BudgetError as exc:
            fields = refusal_fields(exc)
            metrics.admission_observe(
                "refused", exc.code, fields["scope_kind"], time.perf_counter() - started
            )
            level = logging.WARNING if exc.code == "ledger_unavailable" else logging.INFO
            if "tenant" not in fields or fields["tenant"] is None:
                # The tenant the call named (its Request, the one positional argument).
                asked = getattr(args[0], "tenant", None) if args else kwargs.get("tenant")
                fields["tenant"] = asked if isinstance(asked, str) else None
            event_log("admission.refused", level=level, **fields)
            raise
        except Exception:
            metrics.admission_observe("error", "exception", "none", time.perf_counter() - started)
            raise
        metrics.admission_observe("admitted", "admitted", "none", time.perf_counter() - started)
        return result

    return cast(F, wrapper)


def observed_settlement(action: str) -> Callable[[F], F]:
    """Wrap a settlement service (commit, release, ...): count it, log a failure."""

    def decorator(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except Exception as exc:
                reason = exc.code if isinstance(exc, BudgetError) else "exception"
                metrics.settlement_observe(action, reason)
                event_log(
                    "settlement.failed",
                    level=logging.WARNING,
                    action=action,
                    reason=reason,
                    reservation_id=args[0] if args else kwargs.get("reservation_id"),
                    error=str(exc)[:500],
                )
                raise
            metrics.settlement_observe(action, "ok")
            return result

        return cast(F, wrapper)

    return decorator


def observed_expiry(function: F) -> F:
    """Wrap ``reservation_expire``: log each hold it expires."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        expired = function(*args, **kwargs)
        if expired:
            metrics.expiry_observe()
            event_log(
                "hold.expired", reservation_id=args[0] if args else kwargs.get("reservation_id")
            )
        return expired

    return cast(F, wrapper)


def holds_expired(reservation_ids: Sequence[object]) -> None:
    """The holds a sweep batch expired (after its transaction committed): one line each and the
    metric, as ``observed_expiry`` does for one."""
    metrics.expiry_observe(len(reservation_ids))
    for reservation_id in reservation_ids:
        event_log("hold.expired", reservation_id=reservation_id)


def observed_sweep(function: F) -> F:
    """Wrap ``reservations_sweep``: one line and the sweep metrics per run."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        expired = function(*args, **kwargs)
        seconds = time.perf_counter() - started
        metrics.sweep_observe(seconds)
        event_log("sweep.finished", expired=expired, duration_ms=round(seconds * 1000, 1))
        return expired

    return cast(F, wrapper)


def kill_switch_logged(sender: Any, switch: Any, **kwargs: Any) -> None:
    """Receiver of ``kill_switch_tripped`` and ``kill_switch_cleared`` (connected in apps.py)."""
    from llm_budgets.signals import kill_switch_tripped

    tripped = kwargs.get("signal") is kill_switch_tripped
    label = switch.scope_label
    if tripped:
        metrics.trip_observe(scope_kind(label), bool(switch.automatic))
    event_log(
        "kill_switch.tripped" if tripped else "kill_switch.cleared",
        level=logging.WARNING,
        switch_id=switch.pk,
        scope=label,
        scope_kind=scope_kind(label),
        tenant=switch.tenant.external_id if switch.tenant_id else None,
        automatic=bool(switch.automatic),
        detector=switch.detector or None,
        actor=(switch.tripped_by if tripped else switch.cleared_by) or None,
        detail=(switch.reason if tripped else switch.clear_reason) or None,
    )
