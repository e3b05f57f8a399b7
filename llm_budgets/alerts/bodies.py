"""The event types and the schema of each one's body: the one place they are defined.

A body is a flat JSON object. Each field has a kind: ``str``, ``int``, ``bool``, ``money`` (a
decimal as a string, exact: ``"12.5000000000"``), ``time`` (ISO 8601 with its offset, UTC); a
``?`` after the kind lets it be ``null``. ``body_check`` holds every body to its schema before it
is stored (``alerts.emit``) and docs/alerts.md's examples are held to the same schemas by
tests/test_alerts_docs.py. A change to a body that a receiver could notice bumps its version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

KINDS = frozenset({"str", "int", "bool", "money", "time"})


class AlertBodyInvalid(ValueError):
    """A body that does not match its event type's schema (a bug in its emitter)."""

    def __init__(self, event_type: str, problems: list[str]) -> None:
        self.event_type = event_type
        self.problems = problems
        super().__init__(f"{event_type} body: " + "; ".join(problems))


class UnknownEventType(ValueError):
    def __init__(self, event_type: object) -> None:
        self.event_type = event_type
        super().__init__(f"Unknown alert event type {event_type!r}; known: {', '.join(TYPES)}.")


@dataclass(frozen=True)
class Schema:
    type: str
    version: int
    summary: str
    # Installation-wide events go to the operators' endpoints only, never a tenant's.
    tenant_visible: bool
    fields: dict[str, str]


_BUDGET = {
    "budget_id": "int",
    "scope": "str",
    "window": "str",
    "tenant": "str?",
    "end_user": "str?",
    "limit": "money",
    "currency": "str",
    "period_start": "time",
}

_SWITCH = {"switch_id": "int", "scope": "str", "tenant": "str?", "cause": "str", "reason": "str"}

SCHEMAS: tuple[Schema, ...] = (
    Schema(
        "threshold.crossed",
        1,
        "A budget's spent + reserved reached a warning threshold (once per threshold and period).",
        True,
        {**_BUDGET, "threshold": "int", "spent": "money", "reserved": "money", "at": "time"},
    ),
    Schema(
        "budget.projected_to_exceed",
        1,
        "At the recent burn rate a monthly budget reaches its limit before it resets "
        "(once per period; plans that opted in).",
        True,
        {
            **_BUDGET,
            "spent": "money",
            "reserved": "money",
            "projected": "money",
            "runs_out_at": "time",
            "at": "time",
        },
    ),
    Schema(
        "budget.exhausted",
        1,
        "The first refusal of a budget in a period (once per budget, share and period).",
        True,
        {**_BUDGET, "remaining": "money", "requested": "money", "resets_at": "time?", "at": "time"},
    ),
    Schema(
        "kill_switch.tripped",
        1,
        "A kill switch was tripped: by a person (manual), a detector (automatic) or a failed "
        "Stripe payment (payment_failed).",
        True,
        {**_SWITCH, "tripped_by": "str", "detector": "str", "tripped_at": "time"},
    ),
    Schema(
        "kill_switch.cleared",
        1,
        "A kill switch was cleared by a person (one that lapses at its auto_clear_at sends none).",
        True,
        {**_SWITCH, "cleared_by": "str", "clear_reason": "str", "cleared_at": "time"},
    ),
    Schema(
        "run.closed",
        1,
        "A run was closed: later reservations naming it are refused.",
        True,
        {"tenant": "str", "run": "str", "closed_by": "str", "reason": "str", "closed_at": "time"},
    ),
    Schema(
        "hold.expired",
        1,
        "A hold outlived its TTL without being settled: the sweep expired it, its outcome "
        "uncertain (charged as an estimate, or released: EXPIRED_HOLD_POLICY).",
        True,
        {
            "reservation_id": "str",
            "tenant": "str",
            "end_user": "str?",
            "model": "str",
            "amount": "money",
            "currency": "str",
            "policy": "str",
            "reserved_at": "time",
            "expired_at": "time",
        },
    ),
    Schema(
        "stripe.delivery_parked",
        1,
        "Stripe refused a usage delivery: it waits for a person (operators only).",
        False,
        {
            "delivery_id": "int",
            "customer_id": "str",
            "event_name": "str",
            "error": "str",
            "parked_at": "time",
        },
    ),
    Schema(
        "payment.failed",
        1,
        "Stripe reported a failed invoice payment of a linked tenant.",
        True,
        {
            "tenant": "str",
            "invoice_id": "str",
            "stripe_event_id": "str",
            "action": "str",
            "failed_at": "time",
        },
    ),
    Schema(
        "alert.test",
        1,
        "A test event someone sent to one endpoint.",
        True,
        {"message": "str", "sent_by": "str", "at": "time"},
    ),
)

TYPES: dict[str, Schema] = {schema.type: schema for schema in SCHEMAS}

# The budget warnings a tenant's email endpoints receive as the warnings job's own email (its
# template, its exactly-once record: ``jobs.thresholds``), not as an alert email besides it.
WARNING_EMAIL_TYPES = ("threshold.crossed", "budget.projected_to_exceed")


def schema_of(event_type: object) -> Schema:
    if not isinstance(event_type, str) or event_type not in TYPES:
        raise UnknownEventType(event_type)
    return TYPES[event_type]


def _fits(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "money":
        if not isinstance(value, str):
            return False  # a float would not be exact
        try:
            return Decimal(value).is_finite()
        except InvalidOperation:
            return False
    if kind == "time":
        if not isinstance(value, str):
            return False
        try:
            return datetime.fromisoformat(value).tzinfo is not None
        except ValueError:
            return False
    raise AssertionError(f"unknown kind {kind!r}")


def body_check(event_type: str, body: object) -> dict[str, Any]:
    """``body`` if it matches the schema of ``event_type`` exactly (no field missing, none extra,
    each of its kind); else ``AlertBodyInvalid`` naming every problem."""
    schema = schema_of(event_type)
    if not isinstance(body, dict):
        raise AlertBodyInvalid(event_type, ["the body must be a JSON object"])
    problems = [f"missing {name!r}" for name in schema.fields if name not in body]
    problems += [f"unexpected {name!r}" for name in body if name not in schema.fields]
    for name, spec in schema.fields.items():
        if name not in body:
            continue
        kind, nullable = spec.rstrip("?"), spec.endswith("?")
        value = body[name]
        if value is None and nullable:
            continue
        if not _fits(kind, value):
            problems.append(f"{name!r} must be {spec}, not {value!r}")
    if problems:
        raise AlertBodyInvalid(event_type, problems)
    return body
