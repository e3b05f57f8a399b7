"""Emit an alert event: the event row and one delivery row per subscribing endpoint, written in the
caller's transaction, so an event whose cause rolls back is never sent (the outbox pattern, as
``billing/outbox.py`` does for Stripe). ``alerts.delivery`` sends the rows later.

Nobody subscribing is the common case and costs nothing but a set lookup: which (tenant, event
type) pairs have an enabled endpoint is cached per process (:data:`SUBSCRIBED_TTL`). An endpoint
created or changed in another process is seen within that long; this process's own changes
(``alerts.endpoints``) clear the cache at once.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from llm_budgets.alerts.bodies import WARNING_EMAIL_TYPES, body_check, schema_of
from llm_budgets.db.cached import CachedSet
from llm_budgets.models import AlertDelivery, AlertEndpoint, AlertEvent, EndpointKind, Tenant

logger = logging.getLogger("llm_budgets")

SUBSCRIBED_TTL = 10.0
_lock = threading.Lock()

# Dedupe keys this process emitted (or found taken), so a repeated cause (a budget refusing call
# after call) costs no query. Bounded: forgetting one only costs one conflicting insert.
_RECENT_MAX = 4096
_recent: OrderedDict[str, None] = OrderedDict()


@contextmanager
def alert_guard(cause: str) -> Iterator[None]:
    """For a cause that must stand even when its alert cannot be recorded (a kill switch, a
    closed run, the sweep, a parked delivery): the alert's reads and writes in a savepoint, and a
    database error there loses the alert, loudly, never the cause."""
    try:
        with transaction.atomic():
            yield
    except DatabaseError:
        logger.exception("llm_budgets: the alert of %s could not be recorded (it stands)", cause)


def event_uid() -> str:
    return f"evt_{uuid.uuid4().hex}"


def delivery_uid() -> str:
    return f"dlv_{uuid.uuid4().hex}"


def _subscriptions_read() -> Iterator[tuple[int | None, str]]:
    for tenant_id, kind, types in AlertEndpoint.objects.filter(enabled=True).values_list(
        "tenant_id", "kind", "event_types"
    ):
        for event_type in types or ():
            if not warning_email(kind, tenant_id, event_type):
                yield tenant_id, str(event_type)


SUBSCRIPTIONS: CachedSet[tuple[int | None, str]] = CachedSet(SUBSCRIBED_TTL, _subscriptions_read)


def subscriptions_cache_clear() -> None:
    """Forget the cached subscriptions (this process re-reads them on its next emit)."""
    SUBSCRIPTIONS.clear()


def alerts_cache_clear() -> None:
    """Forget the subscriptions and the dedupe keys seen (tests: a rollback undoes rows)."""
    subscriptions_cache_clear()
    with _lock:
        _recent.clear()


def subscribed(event_type: str, tenant_id: int | None) -> bool:
    """Whether some enabled endpoint may want ``event_type`` of ``tenant_id`` (cached)."""
    pairs = SUBSCRIPTIONS.get()
    if (None, event_type) in pairs:
        return True
    return (
        tenant_id is not None
        and schema_of(event_type).tenant_visible
        and (tenant_id, event_type) in pairs
    )


def subscribed_by_any(event_type: str) -> bool:
    """Whether some enabled endpoint, of any owner, subscribes to ``event_type`` (cached)."""
    return any(pair[1] == event_type for pair in SUBSCRIPTIONS.get())


def _endpoints_for(event_type: str, tenant_ids: set[int | None]) -> list[AlertEndpoint]:
    """Enabled endpoints subscribing to ``event_type``: the operators' and, for a type tenants
    may see, those of the tenants named."""
    owners = Q(tenant__isnull=True)
    tenants = {t for t in tenant_ids if t is not None}
    if tenants and schema_of(event_type).tenant_visible:
        owners |= Q(tenant_id__in=tenants)
    return [
        endpoint
        for endpoint in AlertEndpoint.objects.filter(owners, enabled=True).order_by("pk")
        if event_type in (endpoint.event_types or ())
        and not warning_email(endpoint.kind, endpoint.tenant_id, event_type)
    ]


def warning_email(kind: str, tenant_id: int | None, event_type: str) -> bool:
    """Whether a tenant's email endpoint gets ``event_type`` from the warnings job instead (its
    own email, sent exactly once by ``jobs.thresholds``): no alert delivery for it."""
    return (
        kind == EndpointKind.EMAIL and tenant_id is not None and event_type in WARNING_EMAIL_TYPES
    )


def _tenant_id(tenant: Tenant | int | None) -> int | None:
    return tenant.pk if isinstance(tenant, Tenant) else tenant


def _remember(key: str) -> None:
    with _lock:
        _recent[key] = None
        _recent.move_to_end(key)
        while len(_recent) > _RECENT_MAX:
            _recent.popitem(last=False)


def _deliveries(event: AlertEvent, endpoints: Iterable[AlertEndpoint]) -> list[AlertDelivery]:
    return [
        AlertDelivery(
            uid=delivery_uid(),
            event=event,
            endpoint=endpoint,
            next_attempt_at=event.created_at,
            created_at=event.created_at,
        )
        for endpoint in endpoints
        if endpoint.tenant_id is None or endpoint.tenant_id == event.tenant_id
    ]


def _event(
    event_type: str,
    body: dict[str, Any],
    tenant_id: int | None,
    at: datetime,
    dedupe_key: str | None = None,
) -> AlertEvent:
    return AlertEvent(
        uid=event_uid(),
        type=event_type,
        version=schema_of(event_type).version,
        body=body,
        tenant_id=tenant_id,
        dedupe_key=dedupe_key,
        created_at=at,
    )


def alert_emit(
    event_type: str,
    *,
    body: dict[str, Any],
    tenant: Tenant | int | None = None,
    dedupe_key: str | None = None,
    now: datetime | None = None,
    endpoints: Sequence[AlertEndpoint] | None = None,
    guard: str | None = None,
) -> AlertEvent | None:
    """Record ``event_type`` with ``body`` (held to its schema) for ``tenant`` (None: an
    installation-wide event, for the operators' endpoints only), in the caller's transaction,
    with a delivery row for each subscribing endpoint (``endpoints``: exactly these instead, for
    a test event). Returns the event, or None when nobody subscribes or ``dedupe_key`` was taken
    (the event happened already). ``guard`` names a cause that must stand even if its alert
    cannot be written (``alert_guard``)."""
    body_check(event_type, body)
    tenant_id = _tenant_id(tenant)
    if endpoints is None and not subscribed(event_type, tenant_id):
        return None
    if dedupe_key is not None and dedupe_key in _recent:
        return None
    if guard is not None:
        # Only now, with something to write: nobody subscribing costs no savepoint.
        with alert_guard(guard):
            return alert_emit(
                event_type,
                body=body,
                tenant=tenant_id,
                dedupe_key=dedupe_key,
                now=now,
                endpoints=endpoints,
            )
        return None
    targets = list(endpoints) if endpoints is not None else _endpoints_for(event_type, {tenant_id})
    if not targets:
        return None
    at = now or timezone.now()
    try:
        # A savepoint: a taken dedupe key leaves the caller's transaction usable.
        with transaction.atomic():
            event = _event(event_type, body, tenant_id, at, dedupe_key)
            event.save(force_insert=True)
            AlertDelivery.objects.bulk_create(_deliveries(event, targets))
    except IntegrityError:
        if dedupe_key is None or not AlertEvent.objects.filter(dedupe_key=dedupe_key).exists():
            raise
        _remember(dedupe_key)
        return None
    if dedupe_key is not None:
        transaction.on_commit(lambda: _remember(dedupe_key))
    return event


def alerts_emit_many(
    event_type: str,
    items: Sequence[tuple[int | None, dict[str, Any]]],
    *,
    now: datetime | None = None,
    guard: str | None = None,
) -> int:
    """Record one ``event_type`` event per ``(tenant id, body)`` in the caller's transaction, with
    their delivery rows, in a few statements whatever their number (the expiry sweep's batches).
    Returns how many events were recorded. ``guard``: as for ``alert_emit``."""
    schema_of(event_type)  # an unknown type fails even with nothing to emit
    for _, body in items:
        body_check(event_type, body)
    wanted = [(t, b) for t, b in items if subscribed(event_type, t)]
    if not wanted:
        return 0
    if guard is not None:
        with alert_guard(guard):
            return alerts_emit_many(event_type, wanted, now=now)
        return 0
    endpoints = _endpoints_for(event_type, {t for t, _ in wanted})
    at = now or timezone.now()
    events = []
    for tenant_id, body in wanted:
        if any(e.tenant_id is None or e.tenant_id == tenant_id for e in endpoints):
            events.append(_event(event_type, body, tenant_id, at))
    if not events:
        return 0
    AlertEvent.objects.bulk_create(events)
    AlertDelivery.objects.bulk_create(
        [delivery for event in events for delivery in _deliveries(event, endpoints)]
    )
    return len(events)
