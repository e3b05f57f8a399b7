"""Alert endpoints: create, change, rotate the secret, disable, enable, delete; send a test event;
redeliver. The only writer of ``AlertEndpoint`` (the delivery job also counts failures and
disables), audited like every change made on someone's behalf.

A tenant's endpoint receives that tenant's events only; an installation-wide one (no tenant) the
operators': every event. A webhook's signing secret is returned once, by ``endpoint_create`` and
``endpoint_secret_rotate``; nothing shows it again (``secret_hint`` names it).

An email address a tenant adds (``confirm_site``: its key, its admins) receives nothing until it
follows the signed link it is sent (``alerts.confirmation``, ``endpoint_email_confirm``); an
email endpoint with no confirmed address waits disabled. Addresses the operators or the host
add are theirs to vouch for.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from llm_budgets.alerts.addresses import NOT_ALLOWED, host_refused
from llm_budgets.alerts.bodies import TYPES, WARNING_EMAIL_TYPES
from llm_budgets.alerts.confirmation import (
    ConfirmationInvalid,
    confirmation_read,
    confirmation_send,
    confirmation_token,
)
from llm_budgets.alerts.emit import alert_emit, subscriptions_cache_clear
from llm_budgets.clock import time_field
from llm_budgets.conf import conf, email_address_valid
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    AuditEvent,
    EndpointKind,
    Tenant,
)
from llm_budgets.models.fields import split_emails

logger = logging.getLogger("llm_budgets")

SECRET_PREFIX = "llmbsec_"  # noqa: S105 (a prefix, not a secret)
# Why an email endpoint a tenant added is disabled until one of its addresses confirms.
AWAITING_CONFIRMATION = (
    "Awaiting confirmation: no address has followed the link it was sent yet (saving the "
    "addresses again sends a new link to any whose link expired)."
)


class EndpointNotFound(LookupError):
    """No endpoint with that id that the caller may see (another tenant's is not found either)."""

    def __init__(self, endpoint_id: object) -> None:
        self.endpoint_id = endpoint_id
        super().__init__(f"No alert endpoint {endpoint_id!r}.")


class DeliveryNotFound(LookupError):
    def __init__(self, delivery_id: object) -> None:
        self.delivery_id = delivery_id
        super().__init__(f"No alert delivery {delivery_id!r}.")


def http_allowed() -> bool:
    """Plain http:// endpoints: only under DEBUG or ALERTS_ALLOW_HTTP (check llm_budgets.E110)."""
    return bool(settings.DEBUG) or conf.ALERTS_ALLOW_HTTP


def target_validate(kind: str, target: object) -> str:
    """The endpoint's target, checked for its kind: an https URL (http only where allowed) with a
    host and no credentials that reaches only addresses alerts may call (checked again at each
    delivery), or email addresses."""
    if kind not in EndpointKind.values:
        raise InvalidUsage(f"kind must be one of {', '.join(EndpointKind.values)}.", field="kind")
    if not isinstance(target, str) or not target.strip():
        raise InvalidUsage("target is required: a URL or email addresses.", field="target")
    text = target.strip()
    if kind == EndpointKind.EMAIL:
        addresses = split_emails(text)
        if not addresses or not all(email_address_valid(a) for a in addresses):
            raise InvalidUsage("target must be email addresses, comma separated.", field="target")
        return ", ".join(addresses)
    parts = urlsplit(text)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidUsage("target must be an https:// URL with a host.", field="target")
    if parts.scheme == "http" and not http_allowed():
        raise InvalidUsage(
            "target must use https:// (plain http is allowed only under DEBUG or "
            "LLM_BUDGETS['ALERTS_ALLOW_HTTP']).",
            field="target",
        )
    if parts.username or parts.password:
        raise InvalidUsage("target must not carry credentials.", field="target")
    if len(text) > 2000:
        raise InvalidUsage("target is too long (2000 characters at most).", field="target")
    if host_refused(parts.hostname):
        raise InvalidUsage(f"target: {NOT_ALLOWED}.", field="target")
    return text


def event_types_validate(event_types: object, *, tenant: Tenant | None = None) -> list[str]:
    """The event types an endpoint subscribes to: known ones, at least one; for a tenant's
    endpoint only the types a tenant receives (an operators-only type would never reach it:
    refused, named, rather than stored and silently never sent)."""
    if isinstance(event_types, str) or not isinstance(event_types, Iterable):
        raise InvalidUsage("event_types must be a list of event types.", field="event_types")
    chosen = list(dict.fromkeys(event_types))
    unknown = [t for t in chosen if t not in TYPES]
    if unknown or not chosen:
        raise InvalidUsage(
            f"event_types must name at least one of: {', '.join(TYPES)}"
            + (f" (unknown: {', '.join(map(str, unknown))})." if unknown else "."),
            field="event_types",
        )
    operators_only = [t for t in chosen if not TYPES[t].tenant_visible]
    if tenant is not None and operators_only:
        raise InvalidUsage(
            f"event_types: {', '.join(operators_only)} "
            f"{'is' if len(operators_only) == 1 else 'are'} for the operators' "
            "(installation-wide) endpoints only and never reach a tenant's; choose from: "
            f"{', '.join(t for t, schema in TYPES.items() if schema.tenant_visible)}.",
            field="event_types",
        )
    return [str(t) for t in chosen]


def _contacts(value: object) -> str:
    if value in (None, ""):
        return ""
    addresses = split_emails(str(value))
    if not all(email_address_valid(a) for a in addresses):
        raise InvalidUsage("contact_emails must be email addresses.", field="contact_emails")
    return ", ".join(addresses)


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def endpoint_recipients(endpoint: AlertEndpoint) -> list[str]:
    """The addresses an email endpoint sends to: its confirmed ones, in order."""
    pending = endpoint.unconfirmed_emails or {}
    return [a for a in split_emails(endpoint.target) if a not in pending]


def _link_due(sent: object, now: datetime) -> bool:
    """Whether an unconfirmed address is sent a (new) link: never sent, or its link expired."""
    if not isinstance(sent, str) or not sent:
        return True
    expires = datetime.fromisoformat(sent) + timedelta(seconds=conf.ALERTS_EMAIL_CONFIRM_SECONDS)
    return expires <= now


def _tenant_addresses(endpoint: AlertEndpoint) -> tuple[set[str], dict[str, str]]:
    """Of the tenant's other email endpoints: the addresses that receive (confirmed, or added by
    the operators), and those awaiting confirmation with when their link was last sent."""
    receiving: set[str] = set()
    waiting: dict[str, str] = {}
    if endpoint.tenant_id is None:
        return receiving, waiting
    others = (
        AlertEndpoint.objects.filter(tenant_id=endpoint.tenant_id, kind=EndpointKind.EMAIL)
        .exclude(pk=endpoint.pk)
        .only("target", "unconfirmed_emails", "kind")
    )
    for other in others:
        pending = other.unconfirmed_emails or {}
        receiving.update(endpoint_recipients(other))
        for address, sent in pending.items():
            if isinstance(sent, str) and sent > waiting.get(address, ""):
                waiting[address] = sent
    return receiving, waiting


def _pending(
    endpoint: AlertEndpoint, before: str | None, confirm_site: str | None, now: datetime
) -> list[str]:
    """Set ``unconfirmed_emails`` for the endpoint's target (``before``: its target until now,
    None when new) and return the addresses to send a link to. An address a tenant adds is
    unconfirmed (``confirm_site`` given) unless it already receives the tenant's alerts through
    another endpoint; one the operators add is theirs to vouch for; one that was confirmed stays
    so. Consent is per tenant and address: a link still valid for another endpoint of the tenant
    covers this one too (one link per address per validity), and following it confirms both."""
    if endpoint.kind != EndpointKind.EMAIL:
        endpoint.unconfirmed_emails = {}
        return []
    addresses = split_emails(endpoint.target)
    pending = {a: v for a, v in (endpoint.unconfirmed_emails or {}).items() if a in addresses}
    if confirm_site is None:
        endpoint.unconfirmed_emails = pending
        return []
    receiving, waiting = _tenant_addresses(endpoint)
    confirmed = set() if before is None else set(split_emails(before)) - set(pending)
    for address in addresses:
        if address in receiving:
            pending.pop(address, None)
        elif address not in confirmed:
            pending.setdefault(address, "")
    for address, sent in pending.items():
        elsewhere = waiting.get(address, "")
        if _link_due(sent, now) and not _link_due(elsewhere, now):
            pending[address] = elsewhere  # its live link covers this endpoint too
    due = [a for a, sent in pending.items() if _link_due(sent, now)]
    for address in due:
        pending[address] = now.isoformat()
    endpoint.unconfirmed_emails = pending
    return due


def _awaiting(endpoint: AlertEndpoint, now: datetime) -> None:
    """An email endpoint without a confirmed address waits disabled (its events are not even
    queued); the first confirmation, or the operators' own address, enables it again."""
    if endpoint.kind != EndpointKind.EMAIL:
        return
    if not endpoint_recipients(endpoint):
        if endpoint.enabled:
            endpoint.enabled = False
            endpoint.disabled_reason = AWAITING_CONFIRMATION
            endpoint.disabled_at = now
    elif not endpoint.enabled and endpoint.disabled_reason == AWAITING_CONFIRMATION:
        endpoint.enabled = True
        endpoint.disabled_reason = ""
        endpoint.disabled_at = None


def _links_send(endpoint: AlertEndpoint, due: list[str], site: str | None, actor: str) -> None:
    """Email each of ``due`` its confirmation link, once the endpoint is saved. A link that
    could not be sent is marked so (``""``): saving the addresses again sends it."""
    if not due or site is None:
        return
    tenant = endpoint.tenant
    owner = (tenant.name or tenant.external_id) if tenant is not None else "the operators"
    failed = []
    for address in due:
        path = reverse(
            "llm_budgets_api:alert-email-confirm",
            kwargs={"token": confirmation_token(endpoint.pk, address)},
        )
        try:
            confirmation_send(
                link=site.rstrip("/") + path, address=address, owner=owner, actor=actor
            )
        except Exception:
            logger.exception("llm_budgets: could not email %s its confirmation link", address)
            failed.append(address)
    if failed:
        with transaction.atomic():
            locked = AlertEndpoint.objects.select_for_update().get(pk=endpoint.pk)
            pending = dict(locked.unconfirmed_emails or {})
            pending.update({a: "" for a in failed if a in pending})
            locked.unconfirmed_emails = endpoint.unconfirmed_emails = pending
            locked.save(update_fields=["unconfirmed_emails"])


def _snapshot(endpoint: AlertEndpoint) -> dict[str, Any]:
    return {
        "kind": endpoint.kind,
        "target": endpoint.target,
        "event_types": list(endpoint.event_types),
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "secret": endpoint.secret_hint,
        "unconfirmed_emails": sorted(endpoint.unconfirmed_emails or {}),
    }


def _audit(endpoint: AlertEndpoint, action: str, actor: str, before: Any, reason: str = "") -> None:
    AuditEvent.objects.create(
        action=f"alert_endpoint.{action}",
        actor=actor,
        tenant_id=endpoint.tenant_id,
        target=f"alert endpoint {endpoint.pk}",
        before=before,
        after=_snapshot(endpoint) if action != "delete" else None,
        reason=reason,
    )
    # This process sees the change at once; others within SUBSCRIBED_TTL.
    subscriptions_cache_clear()
    transaction.on_commit(subscriptions_cache_clear)


def endpoint_get(endpoint_id: object, *, tenant: Tenant | None) -> AlertEndpoint:
    """The endpoint ``endpoint_id`` as ``tenant`` may see it (its own only), or as the operators
    (``tenant=None``: any); else ``EndpointNotFound``."""
    query = AlertEndpoint.objects.select_related("tenant")
    if tenant is not None:
        query = query.filter(tenant=tenant)
    try:
        return query.get(pk=int(str(endpoint_id)))
    except (AlertEndpoint.DoesNotExist, ValueError):
        raise EndpointNotFound(endpoint_id) from None


def endpoint_create(
    *,
    tenant: Tenant | None,
    kind: str,
    target: object,
    event_types: object,
    description: str = "",
    contact_emails: object = "",
    actor: str = "",
    confirm_site: str | None = None,
) -> tuple[AlertEndpoint, str]:
    """Create an endpoint of ``tenant`` (None: installation-wide). Returns it and, for a webhook,
    its signing secret: shown this once (other kinds: "").

    ``confirm_site``: for an endpoint the tenant creates itself (its key, its admins), where its
    people reach this app (``request.build_absolute_uri("/")``): each email address is sent a
    signed link there and receives nothing until it is followed. None: the caller vouches for
    the addresses (the operators, the host's own code)."""
    clean_target = target_validate(kind, target)
    endpoint = AlertEndpoint(
        tenant=tenant,
        kind=kind,
        target=clean_target,
        event_types=event_types_validate(event_types, tenant=tenant),
        description=str(description or "")[:255],
        contact_emails=_contacts(contact_emails),
        created_by=actor,
    )
    secret = _new_secret() if kind == EndpointKind.WEBHOOK else ""
    endpoint.secret = secret
    now = timezone.now()
    due = _pending(endpoint, None, confirm_site, now)
    _awaiting(endpoint, now)
    with transaction.atomic():
        endpoint.save(force_insert=True)
        _audit(endpoint, "create", actor, None)
    _links_send(endpoint, due, confirm_site, actor)
    return endpoint, secret


def endpoint_update(
    endpoint: AlertEndpoint,
    *,
    target: object = None,
    event_types: object = None,
    description: object = None,
    contact_emails: object = None,
    actor: str = "",
    confirm_site: str | None = None,
) -> AlertEndpoint:
    """Change what is given (None: unchanged). The kind never changes: create another.
    ``confirm_site`` as for ``endpoint_create``: the tenant changes it itself, so an address it
    adds is confirmed first (one whose link expired unfollowed is sent a new one)."""
    before = _snapshot(endpoint)
    due: list[str] = []
    if target is not None:
        previous = endpoint.target
        endpoint.target = target_validate(endpoint.kind, target)
        now = timezone.now()
        due = _pending(endpoint, previous, confirm_site, now)
        _awaiting(endpoint, now)
    if event_types is not None:
        endpoint.event_types = event_types_validate(event_types, tenant=endpoint.tenant)
    if description is not None:
        endpoint.description = str(description)[:255]
    if contact_emails is not None:
        endpoint.contact_emails = _contacts(contact_emails)
    with transaction.atomic():
        endpoint.save()
        _audit(endpoint, "update", actor, before)
    _links_send(endpoint, due, confirm_site, actor)
    return endpoint


def endpoint_secret_rotate(
    endpoint: AlertEndpoint,
    *,
    actor: str = "",
    overlap_seconds: int | None = None,
    now: datetime | None = None,
) -> str:
    """A new signing secret, returned this once. The old one stays valid for
    ``overlap_seconds`` (default ALERTS_SECRET_OVERLAP_SECONDS; 0: at once; at most
    ALERTS_SECRET_OVERLAP_MAX_SECONDS: a leaked old secret must stop signing), each delivery
    signed with both meanwhile, so receivers can switch without losing any."""
    if endpoint.kind != EndpointKind.WEBHOOK:
        raise InvalidUsage("Only a webhook endpoint has a signing secret.", field="kind")
    now = now or timezone.now()
    overlap = conf.ALERTS_SECRET_OVERLAP_SECONDS if overlap_seconds is None else overlap_seconds
    most = conf.ALERTS_SECRET_OVERLAP_MAX_SECONDS
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= most:
        raise InvalidUsage(
            f"overlap_seconds must be a whole number of seconds from 0 to {most} "
            f"(LLM_BUDGETS['ALERTS_SECRET_OVERLAP_MAX_SECONDS']), got {overlap!r}: the old "
            "secret signs no longer than that.",
            field="overlap_seconds",
        )
    before = _snapshot(endpoint)
    secret = _new_secret()
    endpoint.previous_secret = endpoint.secret if overlap else ""
    endpoint.previous_secret_expires_at = now + timedelta(seconds=overlap) if overlap else None
    endpoint.secret = secret
    with transaction.atomic():
        endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_expires_at"])
        _audit(endpoint, "rotate_secret", actor, before)
    return secret


def endpoint_secrets(endpoint: AlertEndpoint, now: datetime) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the previous one during
    its overlap."""
    valid = [endpoint.secret] if endpoint.secret else []
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > now:
        valid.append(endpoint.previous_secret)
    return valid


def endpoint_disable(
    endpoint: AlertEndpoint, *, reason: str, actor: str = "", now: datetime | None = None
) -> AlertEndpoint:
    """Stop sending to it; its deliveries wait (enabling it sends them, in order)."""
    if not reason or not reason.strip():
        raise InvalidUsage("reason is required: say why it is disabled.", field="reason")
    before = _snapshot(endpoint)
    endpoint.enabled = False
    endpoint.disabled_reason = reason.strip()[:255]
    endpoint.disabled_at = now or timezone.now()
    with transaction.atomic():
        endpoint.save(update_fields=["enabled", "disabled_reason", "disabled_at"])
        _audit(endpoint, "disable", actor, before, reason)
    return endpoint


def endpoint_enable(endpoint: AlertEndpoint, *, actor: str = "") -> AlertEndpoint:
    """Send to it again (its failure count starts over). Not an email endpoint none of whose
    addresses has confirmed: it has nobody to send to yet."""
    if endpoint.kind == EndpointKind.EMAIL and not endpoint_recipients(endpoint):
        raise InvalidUsage(
            "No address of this endpoint has confirmed yet: each was sent a link to follow "
            "first (save the addresses again for a new link), and the endpoint is enabled once "
            "one is followed.",
            field="target",
        )
    before = _snapshot(endpoint)
    endpoint.enabled = True
    endpoint.disabled_reason = ""
    endpoint.disabled_at = None
    endpoint.consecutive_failures = 0
    with transaction.atomic():
        endpoint.save(
            update_fields=["enabled", "disabled_reason", "disabled_at", "consecutive_failures"]
        )
        _audit(endpoint, "enable", actor, before)
    return endpoint


def endpoint_delete(endpoint: AlertEndpoint, *, actor: str = "") -> None:
    """Delete it with its deliveries (the events stay)."""
    before = _snapshot(endpoint)
    with transaction.atomic():
        _audit(endpoint, "delete", actor, before)
        endpoint.delete()


def billing_contacts_set(tenant: Tenant, emails: str, *, actor: str = "") -> AlertEndpoint | None:
    """Set the tenant's billing contacts (``ensure_tenant(billing_emails=...)``): its
    billing-contacts email endpoint, created subscribed to the budget warnings, changed, or
    deleted for ``""``. Returns it (None when cleared). Call inside the caller's transaction."""
    addresses = split_emails(emails)
    for address in addresses:
        if not email_address_valid(address):
            raise InvalidUsage(
                f"billing_emails: Enter a valid email address ({address!r} is not one).",
                field="billing_emails",
            )
    endpoint = AlertEndpoint.objects.filter(tenant=tenant, billing_contacts=True).first()
    if not addresses:
        if endpoint is not None:
            endpoint_delete(endpoint, actor=actor)
        return None
    target = ", ".join(addresses)
    if endpoint is None:
        endpoint = AlertEndpoint(
            tenant=tenant,
            kind=EndpointKind.EMAIL,
            target=target,
            event_types=list(WARNING_EMAIL_TYPES),
            description="Billing contacts",
            billing_contacts=True,
            created_by=actor,
        )
        with transaction.atomic():
            endpoint.save(force_insert=True)
            _audit(endpoint, "create", actor, None)
    elif endpoint.target != target:
        endpoint_update(endpoint, target=target, actor=actor)
    return endpoint


def warning_recipients(tenant: Tenant, event_type: str) -> list[str]:
    """Who gets the warnings job's email for ``event_type`` (``WARNING_EMAIL_TYPES``): the
    addresses of the tenant's enabled email endpoints that subscribe to it, in order, once
    each (the billing contacts' endpoint among them)."""
    found: dict[str, None] = {}
    for endpoint in AlertEndpoint.objects.filter(
        tenant=tenant, kind=EndpointKind.EMAIL, enabled=True
    ).only("target", "event_types", "unconfirmed_emails", "kind"):
        if event_type in (endpoint.event_types or ()):
            found.update(dict.fromkeys(endpoint_recipients(endpoint)))
    return list(found)


def endpoint_test_send(
    endpoint: AlertEndpoint, *, actor: str = "", now: datetime | None = None
) -> AlertEvent:
    """Queue an ``alert.test`` event for this endpoint alone (enabled or not: a test may be what
    decides to enable it; it is sent once enabled)."""
    now = now or timezone.now()
    event = alert_emit(
        "alert.test",
        tenant=endpoint.tenant_id,
        body={
            "message": "A test event from llm_budgets.",
            "sent_by": actor,
            "at": time_field(now),
        },
        endpoints=[endpoint],
        now=now,
    )
    assert event is not None  # an explicit endpoint always gets it
    return event


def delivery_get(delivery_id: object, *, tenant: Tenant | None) -> AlertDelivery:
    query = AlertDelivery.objects.select_related("event", "endpoint")
    if tenant is not None:
        query = query.filter(endpoint__tenant=tenant)
    try:
        return query.get(pk=int(str(delivery_id)))
    except (AlertDelivery.DoesNotExist, ValueError):
        raise DeliveryNotFound(delivery_id) from None


def delivery_redeliver(
    delivery: AlertDelivery, *, actor: str = "", now: datetime | None = None
) -> AlertDelivery:
    """Send a delivery again, with the same delivery id (a receiver that stored it ignores it):
    back in its endpoint's queue, due now, with a fresh retry horizon."""
    now = now or timezone.now()
    before = {"state": delivery.state, "attempts": delivery.attempts}
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery.pk).update(
            state=AlertDeliveryState.PENDING,
            next_attempt_at=now,
            first_attempt_at=None,
        )
        AuditEvent.objects.create(
            action="alert_delivery.redeliver",
            actor=actor,
            tenant_id=delivery.endpoint.tenant_id,
            target=f"alert delivery {delivery.uid}",
            before=before,
            after={"state": AlertDeliveryState.PENDING},
        )
    delivery.refresh_from_db()
    return delivery


def confirmation_target(token: str) -> tuple[AlertEndpoint, str, bool]:
    """The endpoint and the address a confirmation link names, and whether that address is
    confirmed already; ``ConfirmationInvalid`` for a bad or expired link, or one whose endpoint
    or address is gone. Reads only (the page that asks to confirm)."""
    endpoint_id, address = confirmation_read(token)
    endpoint = AlertEndpoint.objects.select_related("tenant").filter(pk=endpoint_id).first()
    if endpoint is None:
        raise ConfirmationInvalid(
            "The alerts this link confirms were removed since: nothing will be sent to you."
        )
    if address not in split_emails(endpoint.target):
        raise ConfirmationInvalid(
            "This address is no longer one these alerts go to: nothing will be sent to you."
        )
    return endpoint, address, address not in (endpoint.unconfirmed_emails or {})


def endpoint_email_confirm(token: str, *, now: datetime | None = None) -> tuple[AlertEndpoint, str]:
    """Confirm the address a link names: it receives the tenant's alerts from now on, on every
    email endpoint of the tenant where it waited (each one waiting for its first confirmation is
    enabled). Audited per endpoint, with the address as the actor. Following a link twice
    confirms once."""
    now = now or timezone.now()
    endpoint, address, confirmed = confirmation_target(token)
    if confirmed:
        return endpoint, address
    same_owner = (
        {"tenant_id": endpoint.tenant_id} if endpoint.tenant_id is not None else {"pk": endpoint.pk}
    )
    with transaction.atomic():
        # Locked in pk order, as every writer of several endpoints would: no lock cycle.
        for locked in (
            AlertEndpoint.objects.select_for_update()
            .filter(kind=EndpointKind.EMAIL, **same_owner)
            .order_by("pk")
        ):
            pending = dict(locked.unconfirmed_emails or {})
            if address not in pending or address not in split_emails(locked.target):
                continue
            before = _snapshot(locked)
            del pending[address]
            locked.unconfirmed_emails = pending
            _awaiting(locked, now)
            locked.save(
                update_fields=["unconfirmed_emails", "enabled", "disabled_reason", "disabled_at"]
            )
            _audit(locked, "confirm_email", address, before)
    endpoint.refresh_from_db()
    return endpoint, address
