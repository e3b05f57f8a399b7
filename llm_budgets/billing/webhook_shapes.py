"""The shape of a Stripe event, read once from the signed body before anything acts on it.

:func:`event_read` decodes the body and checks every field the handler of its type reads
(:data:`READERS`): a string where an id is read (1 to 255 characters, storable: PostgreSQL text
refuses NUL, and an unpaired surrogate is not UTF-8), a whole number of minor units where an
amount is read, an object where one is walked, an id of ours where a payment names its top-up.
A body that fails is not an event this app can act on: :class:`WebhookPayloadError` says which
field (its path from the event's root, as in Stripe's JSON: ``data.object.metadata``) and what
it holds, and the webhook stores the event as *unprocessable* with that reason
(billing/webhooks.py), answering 200 so that Stripe does not retry it for days.

Stripe's own events pass: only what Stripe documents as optional may be missing or null, and
fields no handler reads are not looked at.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llm_budgets.billing.topups import METADATA_KEY
from llm_budgets.exceptions import Fault, InvalidUsage
from llm_budgets.validation import first_unstorable, json_depth_exceeds, storable

# Stripe's ids are far shorter; the columns that keep them hold 255 characters.
MAX_ID_LENGTH = 255
# Stripe's events nest a few levels; deeper JSON is refused before it is decoded (the decoder
# would recurse once per level).
MAX_DEPTH = 64
# Amounts in minor units: Stripe charges at most 12 digits; more is not an amount it charged.
MAX_MINOR_UNITS = 10**12 - 1
# A top-up's id: the primary key's range (a 64-bit integer).
MAX_TOP_UP_ID = 2**63 - 1

_MISSING = object()


class WebhookPayloadError(InvalidUsage):
    """Signed, but not the shape of a Stripe event this app reads; ``field`` names where."""

    fault = Fault.CALLER


def event_read(body: bytes) -> dict[str, Any]:
    """The event in ``body`` (already verified as signed), every field its handler reads
    checked; else :class:`WebhookPayloadError` naming the field."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refused("body", f"is not UTF-8 (byte {exc.start})") from None
    if json_depth_exceeds(text, MAX_DEPTH):
        raise _refused("body", f"nests deeper than {MAX_DEPTH} levels")
    try:
        event = json.loads(text)
    except ValueError as exc:
        raise _refused("body", f"is not JSON ({str(exc)[:200]})") from None
    if not isinstance(event, dict):
        raise _refused("body", f"must be a JSON object; got {_shown(event)}")
    _text(event, "id", "")
    kind = _text(event, "type", "")
    data = _dict(event, "data", "")
    _dict(data or {}, "object", "data")
    reader = READERS.get(kind or "")
    if reader is not None:
        reader(event)
    return event


def event_identity(body: bytes) -> tuple[str | None, str]:
    """The id ``body`` names, where it is text a column can keep (else None), and its type as
    text a column can keep (escaped where it holds NUL or unpaired surrogates; empty where it is
    not a string). Never raises: for storing an event that could not be read."""
    text = body.decode("utf-8", "replace")
    event: object = None
    if not json_depth_exceeds(text, MAX_DEPTH):
        try:
            event = json.loads(text)
        except ValueError:
            event = None
    if not isinstance(event, dict):
        return None, ""
    ident, kind = event.get("id"), event.get("type")
    if not isinstance(kind, str):
        kind = ""
    elif not storable(kind):
        kind = kind.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return (ident if _is_id(ident) else None), kind[:MAX_ID_LENGTH]


def body_text(body: bytes) -> str:
    """``body`` as a person reads it: UTF-8, with any byte that is not shown as ``\\xNN``."""
    return body.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def _is_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and storable(value)


def _refused(path: str, what: str) -> WebhookPayloadError:
    return WebhookPayloadError(f"{path} {what}.", field=path)


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _shown(value: object) -> str:
    """What a field holds, in words, without quoting it (it may be huge or unprintable)."""
    if value is _MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        digits = len(str(abs(value)))  # json.loads refuses more than 4300 digits
        return str(value) if digits < 20 else f"an integer of {digits} digits"
    if isinstance(value, float):
        return "a number with a fraction or an exponent"
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
    """``obj[key]``: a string of 1 to MAX_ID_LENGTH characters a database can store (None when
    not ``required`` and missing or null)."""
    value = obj.get(key, _MISSING)
    path = _path(where, key)
    if not required and value in (_MISSING, None):
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise _refused(
            path, f"must be a string of 1 to {MAX_ID_LENGTH} characters; got {_shown(value)}"
        )
    if not storable(value):
        raise _refused(
            path, "contains a NUL character or an unpaired surrogate, which no database stores"
        )
    return value


def _amount(obj: dict[str, Any], key: str, where: str) -> int:
    """``obj[key]``: a whole number of minor units, 0 to MAX_MINOR_UNITS."""
    value = obj.get(key, _MISSING)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MINOR_UNITS:
        raise _refused(
            _path(where, key),
            f"must be a whole number of minor units from 0 to {MAX_MINOR_UNITS}; "
            f"got {_shown(value)}",
        )
    return value


def _dict(obj: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    """``obj[key]``: an object, or None when missing or null."""
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise _refused(_path(where, key), f"must be an object; got {_shown(value)}")
    return value


def _object(event: dict[str, Any]) -> dict[str, Any]:
    """``data.object`` (checked to be an object, or missing)."""
    return (event.get("data") or {}).get("object") or {}


def _top_up(obj: dict[str, Any]) -> int | None:
    """The top-up ``metadata.llmb_top_up`` names (None when the payment names none)."""
    metadata = _dict(obj, "metadata", "data.object")
    value = (metadata or {}).get(METADATA_KEY)
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value.isascii()
        or not value.isdigit()
        or len(value) > len(str(MAX_TOP_UP_ID))
        or int(value) > MAX_TOP_UP_ID
    ):
        raise _refused(
            f"data.object.metadata.{METADATA_KEY}",
            f"must be the id of a top-up (ASCII digits, at most {MAX_TOP_UP_ID}); "
            f"got {_shown(value)}",
        )
    return int(value)


def _invoice(event: dict[str, Any]) -> None:
    """invoice.payment_failed, .paid, .voided: the invoice and its customer."""
    obj = _object(event)
    _text(obj, "id", "data.object")
    _text(obj, "customer", "data.object")


def _customer(event: dict[str, Any]) -> None:
    _text(_object(event), "id", "data.object")


def _checkout(event: dict[str, Any]) -> None:
    """A Checkout session: a top-up's is credited from its amount, currency and customer."""
    obj = _object(event)
    if _top_up(obj) is None:
        return  # not a top-up: nothing else is read
    _text(obj, "payment_status", "data.object", required=False)
    _text(obj, "payment_intent", "data.object", required=False)
    _amount(obj, "amount_total", "data.object")
    _text(obj, "currency", "data.object")
    _text(obj, "customer", "data.object")


def _payment(event: dict[str, Any]) -> None:
    """A payment intent: a top-up's is credited, and its payment method saved."""
    obj = _object(event)
    if _top_up(obj) is None:
        return
    _text(obj, "id", "data.object")
    _amount(obj, "amount_received", "data.object")
    _text(obj, "currency", "data.object")
    _text(obj, "customer", "data.object")
    _text(obj, "payment_method", "data.object", required=False)


def _taken_back(amount: str) -> Callable[[dict[str, Any]], None]:
    """A refund or dispute: the payment intent it names, and the amount taken back."""

    def check(event: dict[str, Any]) -> None:
        obj = _object(event)
        if _text(obj, "payment_intent", "data.object", required=False) is not None:
            _amount(obj, amount, "data.object")

    return check


def _meter_report(event: dict[str, Any]) -> None:
    """A meter error report is read leniently (any shape records what it can), but each string
    in it may be stored."""
    bad = first_unstorable(event.get("data") or {})
    if bad is not None:
        raise _refused(
            f"data.{bad}",
            "contains a NUL character or an unpaired surrogate, which no database stores",
        )


# Each handled event type's check (billing/webhooks.py HANDLERS, billing/topups.py HANDLERS).
READERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "invoice.payment_failed": _invoice,
    "invoice.paid": _invoice,
    "invoice.voided": _invoice,
    "customer.deleted": _customer,
    "v1.billing.meter.error_report_triggered": _meter_report,
    "v1.billing.meter.no_meter_found": _meter_report,
    "checkout.session.completed": _checkout,
    "checkout.session.async_payment_succeeded": _checkout,
    "payment_intent.succeeded": _payment,
    "charge.refunded": _taken_back("amount_refunded"),
    "charge.dispute.created": _taken_back("amount"),
    "charge.dispute.closed": _taken_back("amount"),
}
