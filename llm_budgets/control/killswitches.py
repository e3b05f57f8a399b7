"""Kill switches: trip and clear a stop on a scope, and find the open ones that cover a request.

Admission reads switches from the database on every call, with no cache, so a trip committed on
one connection refuses the very next admission on every other process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from llm_budgets import hooks, validation
from llm_budgets.clock import time_field
from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import ledger_guard, ledger_transaction
from llm_budgets.exceptions import InvalidUsage, KillSwitchActive, LedgerUnavailable
from llm_budgets.models import ApiKey, AuditEvent, EndUser, KillSwitch, Run, Tenant
from llm_budgets.signals import kill_switch_cleared, kill_switch_tripped
from llm_budgets.tenancy.runs import run_ensure, run_validate
from llm_budgets.tenancy.tenants import end_user_ensure, tenant_get

logger = logging.getLogger("llm_budgets")
# Tries of one trip whose insert loses to a concurrent trip whose switch is then cleared (each
# such loss leaves the scope free again): one more nearly always succeeds.
TRIP_ATTEMPTS = 3


@dataclass(frozen=True)
class SwitchScope:
    """No field: global. Several: their intersection."""

    tenant: Tenant | None = None
    end_user: EndUser | None = None
    provider: str = ""
    model: str = ""
    api_key: ApiKey | None = None
    run: Run | None = None

    @property
    def key(self) -> str:
        key = (
            f"t={self.tenant.pk if self.tenant else ''}|"
            f"u={self.end_user.pk if self.end_user else ''}|"
            f"p={self.provider}|m={self.model}"
        )
        # Appended only when set, so the keys of switches without one never change.
        key = f"{key}|k={self.api_key.prefix}" if self.api_key else key
        return f"{key}|r={self.run.pk}" if self.run else key


def switch_scope(
    *,
    tenant: object = None,
    end_user: object = None,
    provider: object = None,
    model: object = None,
    api_key: object = None,
    run: object = None,
    create_end_user: bool = True,
) -> SwitchScope | None:
    """Resolve the scope arguments of trip/clear. ``None`` when the end user was never seen and
    ``create_end_user`` is off (nothing can be tripped on it yet)."""
    if end_user is not None and tenant is None:
        raise InvalidUsage(
            "end_user needs a tenant: end users belong to one tenant.", field="tenant"
        )
    if run is not None and tenant is None:
        raise InvalidUsage("run needs a tenant: runs belong to one tenant.", field="tenant")
    tenant_obj = None if tenant is None else tenant_get(validation.identifier("tenant", tenant))
    user_obj = None
    if end_user is not None and tenant_obj is not None:
        user_id = validation.identifier("end_user", end_user)
        if create_end_user:
            user_obj = end_user_ensure(tenant_obj, user_id)
        else:
            user_obj = EndUser.objects.filter(tenant=tenant_obj, external_id=user_id).first()
            if user_obj is None:
                return None
    key_obj = None
    if api_key is not None:
        # By its visible prefix: the key itself is a secret and never stored.
        prefix = validation.identifier("api_key", api_key, max_length=8)
        key_obj = ApiKey.objects.filter(prefix=prefix).first()
        if key_obj is None:
            raise InvalidUsage(f"No API key has the prefix {prefix!r}.", field="api_key")
    run_obj = None
    if run is not None and tenant_obj is not None:
        # A run not seen yet is created: a switch can stop a run before its first call.
        run_obj = run_ensure(tenant_obj, run_validate(run))
    return SwitchScope(
        run=run_obj,
        tenant=tenant_obj,
        end_user=user_obj,
        provider=""
        if provider is None
        else validation.identifier("provider", provider, max_length=64),
        model="" if model is None else validation.identifier("model", model, max_length=128),
        api_key=key_obj,
    )


def _reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidUsage(
            "reason is required: say why, so the person who is refused (and whoever clears it) "
            "knows.",
            field="reason",
        )
    return reason.strip()


def _snapshot(switch: KillSwitch) -> dict[str, object]:
    return {
        "id": switch.pk,
        "scope": switch.scope_label,
        "reason": switch.reason,
        "automatic": switch.automatic,
        "detector": switch.detector,
        "auto_clear_at": switch.auto_clear_at.isoformat() if switch.auto_clear_at else None,
    }


@ledger_guard("kill switch trip")
def kill_switch_trip(
    *,
    scope: SwitchScope,
    reason: object,
    actor: str = "",
    automatic: bool = False,
    detector: str = "",
    auto_clear_at: datetime | None = None,
    now: datetime | None = None,
) -> KillSwitch:
    """Trip a switch on ``scope``. Tripping a scope that is already tripped returns the open
    switch unchanged (its first reason stands). Audited; signal and email after commit."""
    reason_text = _reason(reason)
    now = now or timezone.now()
    if auto_clear_at is not None and auto_clear_at <= now:
        raise InvalidUsage("auto_clear_at must be in the future.", field="auto_clear_at")
    # A concurrent trip of the same scope may win the insert, and a concurrent clear may then
    # close its switch before this one reads it: the scope is free again, so trip it anew.
    for _attempt in range(TRIP_ATTEMPTS):
        try:
            with ledger_transaction():
                existing = _open_for_scope(scope, now)
                if existing is not None:
                    return existing
                # A switch whose auto_clear_at passed is closed now, so the scope can be tripped
                # again.
                KillSwitch.objects.filter(scope_key=scope.key, cleared_at__isnull=True).update(
                    cleared_at=now, cleared_by="auto_clear_at", clear_reason="auto_clear_at passed"
                )
                switch = KillSwitch.objects.create(
                    tenant=scope.tenant,
                    end_user=scope.end_user,
                    provider=scope.provider,
                    model=scope.model,
                    api_key=scope.api_key,
                    run=scope.run,
                    scope_key=scope.key,
                    reason=reason_text,
                    tripped_by=actor,
                    tripped_at=now,
                    automatic=automatic,
                    detector=detector,
                    auto_clear_at=auto_clear_at,
                )
                AuditEvent.objects.create(
                    action="kill_switch.trip",
                    actor=actor or (f"detector:{detector}" if automatic else ""),
                    tenant=scope.tenant,
                    target=f"kill switch {switch.pk}: {switch.scope_label}",
                    after=_snapshot(switch),
                    reason=reason_text,
                )
                _alert(switch, tripped=True)
                transaction.on_commit(functools.partial(_announce, switch, tripped=True))
        except IntegrityError as exc:
            if not _one_open_per_scope(exc):
                raise
            found = _open_for_scope(scope, now)
            if found is not None:
                return found  # the concurrent trip won: theirs is the open switch
            continue
        return switch
    raise LedgerUnavailable(
        "Other trips and clears of the same kill switch scope won this trip's insert "
        f"{TRIP_ATTEMPTS} times; this call changed nothing. Retry it.",
        retry_after=1,
    )


def _one_open_per_scope(exc: IntegrityError) -> bool:
    """Whether ``exc`` is the unique constraint of one open switch per scope (PostgreSQL names
    it; SQLite names its column)."""
    return "llmb_killswitch_one_open_per_scope" in str(exc) or "killswitch.scope_key" in str(exc)


@ledger_guard("kill switch clear")
def kill_switch_clear(
    *,
    scope: SwitchScope | None = None,
    switch_id: int | None = None,
    reason: object,
    actor: str = "",
    now: datetime | None = None,
) -> KillSwitch:
    """Clear the open switch on exactly ``scope`` (or the switch ``switch_id``). A person clears:
    ``reason`` is required. Audited; signal and email after commit."""
    reason_text = _reason(reason)
    now = now or timezone.now()
    with ledger_transaction():
        query = KillSwitch.objects.select_for_update().filter(cleared_at__isnull=True)
        if switch_id is not None:
            query = query.filter(pk=switch_id)
        else:
            # No scope: the end user named was never seen, so nothing can be tripped on it.
            query = query.filter(scope_key=scope.key) if scope is not None else query.none()
        switch = query.first()
        if switch is None:
            raise InvalidUsage(
                "No kill switch is tripped on that scope (a switch is cleared on exactly the "
                "scope it was tripped on).",
                field="scope",
            )
        before = _snapshot(switch)
        switch.cleared_at = now
        switch.cleared_by = actor
        switch.clear_reason = reason_text
        switch.save(update_fields=["cleared_at", "cleared_by", "clear_reason"])
        AuditEvent.objects.create(
            action="kill_switch.clear",
            actor=actor,
            tenant=switch.tenant,
            target=f"kill switch {switch.pk}: {switch.scope_label}",
            before=before,
            after={"cleared_at": now.isoformat(), "cleared_by": actor},
            reason=reason_text,
        )
        _alert(switch, tripped=False)
        transaction.on_commit(lambda: _announce(switch, tripped=False))
    return switch


# "A kill switch is open now": not cleared, and its ``auto_clear_at`` (if any) not yet passed.
# Spelled here only, in the three forms callers need; tests/test_rule_parity.py checks they agree
# and that no other module spells the rule again.


def switch_open_q(now: datetime) -> Q:
    """ORM filter: the switches open (refusing calls) at ``now``."""
    return Q(cleared_at__isnull=True) & (Q(auto_clear_at__isnull=True) | Q(auto_clear_at__gt=now))


def switch_open_sql(alias: str, at: str = "%s") -> str:
    """SQL condition on kill switch ``alias``: open at the time ``at``, an SQL expression (by
    default its one parameter, prepared with ``switch_open_param``)."""
    cleared = f"{alias}.{sql.column(KillSwitch, 'cleared_at')}"
    auto_clear = f"{alias}.{sql.column(KillSwitch, 'auto_clear_at')}"
    return f"{cleared} IS NULL AND ({auto_clear} IS NULL OR {auto_clear} > {at})"


def switch_open_param(now: datetime) -> object:
    """``switch_open_sql``'s parameter."""
    return sql.param(KillSwitch, "auto_clear_at", now)


def switch_is_open(switch: KillSwitch, now: datetime) -> bool:
    """Whether a loaded switch is open at ``now``."""
    return switch.cleared_at is None and (
        switch.auto_clear_at is None or switch.auto_clear_at > now
    )


def kill_switches_in_state(state: str | None, now: datetime) -> QuerySet[KillSwitch]:
    """Switches ``"open"`` (refusing now), ``"cleared"`` (cleared, or past ``auto_clear_at``),
    or all (``None``), newest first."""
    switches = KillSwitch.objects.select_related("tenant", "end_user", "api_key", "run")
    if state == "open":
        return switches.filter(switch_open_q(now))
    if state == "cleared":
        return switches.exclude(switch_open_q(now))
    return switches.all()


def _open_for_scope(scope: SwitchScope, now: datetime) -> KillSwitch | None:
    return KillSwitch.objects.filter(switch_open_q(now), scope_key=scope.key).first()


def kill_switches_covering(
    *,
    tenant_id: int | None,
    end_user_id: int | None,
    provider: str,
    models: Iterable[str],
    now: datetime,
    api_key_id: str | None = None,
    run_id: int | None = None,
    first: sql.Statement | None = None,
) -> list[KillSwitch]:
    """Every open switch whose scope covers a request, in one indexed query (uncleared rows
    only). ``models``: every model the request might be served as. ``api_key_id``: the REST API
    key the request came through, if any (a switch on a key covers only calls through it).
    ``first``: a statement sent ahead of it in the same round trip (``statements.fetch``)."""
    # Every admission asks this: one statement without the ORM's compilation (see
    # ``db.statements``). A None id compares unknown in SQL: only unscoped rows match.
    model_list = sorted(set(models))
    params = [
        switch_open_param(now),
        tenant_id,
        end_user_id,
        provider,
        *model_list,
        api_key_id,
        run_id,
    ]
    rows = sql.fetch(_covering_sql(len(model_list)), params, first=first)
    return [sql.row_to(KillSwitch, row) for row in rows]


@functools.cache
def _covering_sql(models: int) -> str:
    def col(name: str) -> str:
        return f"k.{sql.column(KillSwitch, name)}"

    def unscoped_or_equal(name: str, unscoped: str) -> str:
        return f"({col(name)} {unscoped} OR {col(name)} = %s)"

    model_in, empty = ", ".join(["%s"] * models), "= ''"
    return (
        f"SELECT {sql.columns(KillSwitch, 'k')} FROM {sql.table(KillSwitch)} k"  # noqa: S608
        f" WHERE {switch_open_sql('k')}"
        f" AND {unscoped_or_equal('tenant', 'IS NULL')}"
        f" AND {unscoped_or_equal('end_user', 'IS NULL')}"
        f" AND {unscoped_or_equal('provider', empty)}"
        f" AND ({col('model')} = '' OR {col('model')} IN ({model_in}))"
        f" AND {unscoped_or_equal('api_key', 'IS NULL')}"
        f" AND {unscoped_or_equal('run', 'IS NULL')}"
        f" ORDER BY {col('tripped_at')}"
    )


def refusal_for(
    switch: KillSwitch, *, tenant: str, end_user: str | None, model: str, run: str | None = None
) -> KillSwitchActive:
    return KillSwitchActive(
        switch_id=switch.pk,
        scope=_label_without_queries(switch, tenant, end_user, run),
        reason=switch.reason,
        tripped_by=switch.tripped_by,
        tripped_at=switch.tripped_at,
        automatic=switch.automatic,
        tenant=tenant,
        end_user=end_user,
        model=model,
    )


def _label_without_queries(
    switch: KillSwitch, tenant: str, end_user: str | None, run: str | None = None
) -> str:
    # The switch covers this request, so its tenant, end user and run are the request's own.
    parts = []
    if switch.end_user_id is not None:
        parts.append(f"end user {tenant}/{end_user}")
    elif switch.tenant_id is not None and switch.run_id is None:
        parts.append(f"tenant {tenant}")
    if switch.provider:
        parts.append(f"provider {switch.provider}")
    if switch.model:
        parts.append(f"model {switch.model}")
    if switch.api_key_id is not None:
        parts.append(f"API key {switch.api_key_id.partition('.')[0]}")  # pk is <prefix>.<hash>
    if switch.run_id is not None:
        parts.append(f"run {run} of {tenant}")
    return ", ".join(parts) or "global"


# The detector of the switch a failed Stripe payment trips (billing/webhooks.py uses it).
PAYMENT_FAILED_DETECTOR = "stripe_payment_failed"


def switch_cause(switch: KillSwitch) -> str:
    """Why a switch is tripped, as alerts say it: "manual", "automatic" or "payment_failed"."""
    if not switch.automatic:
        return "manual"
    return "payment_failed" if switch.detector == PAYMENT_FAILED_DETECTOR else "automatic"


def _alert(switch: KillSwitch, *, tripped: bool) -> None:
    """The switch's alert event, in the transaction that trips or clears it."""
    common = {
        "switch_id": switch.pk,
        "scope": switch.scope_label,
        "tenant": switch.tenant.external_id if switch.tenant else None,
        "cause": switch_cause(switch),
        "reason": switch.reason,
    }
    if tripped:
        body = {
            **common,
            "tripped_by": switch.tripped_by,
            "detector": switch.detector,
            "tripped_at": time_field(switch.tripped_at),
        }
        hooks.event_record(
            "kill_switch.tripped",
            tenant=switch.tenant_id,
            body=body,
            guard=f"kill switch {switch.pk}",
        )
    else:
        assert switch.cleared_at is not None
        body = {
            **common,
            "cleared_by": switch.cleared_by,
            "clear_reason": switch.clear_reason,
            "cleared_at": time_field(switch.cleared_at),
        }
        hooks.event_record(
            "kill_switch.cleared",
            tenant=switch.tenant_id,
            body=body,
            guard=f"kill switch {switch.pk}",
        )


def _announce(switch: KillSwitch, *, tripped: bool) -> None:
    """After commit: the signal, then the operators' email. A failing email never undoes a trip."""
    signal = kill_switch_tripped if tripped else kill_switch_cleared
    signal.send(sender=KillSwitch, switch=switch)
    recipients = conf.OPERATOR_EMAILS
    if not recipients:
        return
    if tripped:
        who = switch.tripped_by or (f"detector {switch.detector}" if switch.automatic else "?")
        subject = f"[llm_budgets] Kill switch tripped on {switch.scope_label}"
        body = (
            f"Tripped by {who} at {switch.tripped_at.isoformat()}.\nReason: {switch.reason}\n\n"
            "Every admission in this scope is refused until a person clears it."
        )
    else:
        subject = f"[llm_budgets] Kill switch cleared on {switch.scope_label}"
        body = (
            f"Cleared by {switch.cleared_by or '?'} at "
            f"{switch.cleared_at.isoformat() if switch.cleared_at else '?'}.\n"
            f"Reason: {switch.clear_reason}\nIt was tripped for: {switch.reason}"
        )
    try:
        send_mail(subject, body, None, recipients)
    except Exception:
        logger.exception("llm_budgets: could not email operators about kill switch %s", switch.pk)
