"""What each endpoint kind is sent: the signed JSON envelope (webhooks), a readable message for
Slack and Microsoft Teams incoming webhooks, and an email. Money through ``money.money`` (the one
format people read), times through ``clock.when`` in the tenant's timezone (the site's for
installation-wide events)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

from llm_budgets.clock import when
from llm_budgets.models import AlertEvent
from llm_budgets.money import money


def envelope(event: AlertEvent) -> bytes:
    """The webhook body: the event as receivers see it, compact, keys sorted (what is signed)."""
    return json.dumps(
        {
            "id": event.uid,
            "type": event.type,
            "version": event.version,
            "created_at": event.created_at.isoformat(),
            "tenant": event.tenant.external_id if event.tenant else None,
            "data": event.body,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


def _zone(event: AlertEvent) -> str | None:
    return event.tenant.timezone if event.tenant else None


def _money(body: dict[str, Any], field: str) -> str:
    return money(Decimal(body[field]), body.get("currency", ""))


def _when(event: AlertEvent, value: str | None) -> str:
    return when(datetime.fromisoformat(value), _zone(event)) if value else "-"


def message(event: AlertEvent) -> tuple[str, list[str]]:
    """A title and a few lines a person reads in a chat or an email."""
    b = event.body
    kind = event.type
    if kind == "threshold.crossed":
        return (
            f"Budget {b['scope']} reached {b['threshold']}% of its {b['window']} limit",
            [
                f"Used {_money(b, 'spent')} spent + {_money(b, 'reserved')} held "
                f"of {_money(b, 'limit')}.",
                f"At {_when(event, b['at'])}.",
            ],
        )
    if kind == "budget.projected_to_exceed":
        return (
            f"Budget {b['scope']} is projected to run out before it resets",
            [
                f"Projected {_money(b, 'projected')} against a limit of {_money(b, 'limit')}.",
                f"Runs out around {_when(event, b['runs_out_at'])}.",
            ],
        )
    if kind == "budget.exhausted":
        resets = _when(event, b["resets_at"]) if b["resets_at"] else "never (or not by waiting)"
        return (
            f"Budget {b['scope']} refused a call: its {b['window']} limit is used up",
            [
                f"{_money(b, 'remaining')} left of {_money(b, 'limit')}; the call needed "
                f"{_money(b, 'requested')}.",
                f"Has room again: {resets}.",
            ],
        )
    if kind == "kill_switch.tripped":
        who = b["tripped_by"] or b["detector"] or "?"
        return (
            f"Kill switch tripped on {b['scope']} ({b['cause'].replace('_', ' ')})",
            [f"Reason: {b['reason']}", f"By {who} at {_when(event, b['tripped_at'])}."],
        )
    if kind == "kill_switch.cleared":
        return (
            f"Kill switch cleared on {b['scope']}",
            [
                f"Reason: {b['clear_reason']} (it was tripped for: {b['reason']})",
                f"By {b['cleared_by'] or '?'} at {_when(event, b['cleared_at'])}.",
            ],
        )
    if kind == "run.closed":
        return (
            f"Run {b['run']} of {b['tenant']} closed",
            [
                f"By {b['closed_by'] or '?'} at {_when(event, b['closed_at'])}. "
                f"{b['reason']}".strip()
            ],
        )
    if kind == "hold.expired":
        return (
            f"A hold of {_money(b, 'amount')} on {b['model']} expired unsettled",
            [
                f"Reservation {b['reservation_id']} of {b['tenant']}, taken at "
                f"{_when(event, b['reserved_at'])}; policy: {b['policy']}.",
            ],
        )
    if kind == "stripe.delivery_parked":
        return (
            f"Stripe usage delivery {b['delivery_id']} parked",
            [f"Customer {b['customer_id']}: {b['error']}", "A person retries it once fixed."],
        )
    if kind == "payment.failed":
        return (
            f"Payment failed for {b['tenant']}",
            [
                f"Stripe invoice {b['invoice_id']}, at {_when(event, b['failed_at'])}; "
                f"action: {b['action']}."
            ],
        )
    return (f"Test event ({kind})", [str(b.get("message", ""))])


def slack(event: AlertEvent) -> bytes:
    """A Slack incoming-webhook message: the text, and the same as a block."""
    title, lines = message(event)
    text = f"*{title}*\n" + "\n".join(lines)
    return json.dumps(
        {
            "text": f"{title}\n" + "\n".join(lines),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        }
    ).encode()


def teams(event: AlertEvent) -> bytes:
    """A Microsoft Teams incoming-webhook (Workflows) message: an Adaptive Card."""
    title, lines = message(event)
    card = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": title, "weight": "Bolder", "wrap": True},
            *({"type": "TextBlock", "text": line, "wrap": True} for line in lines),
        ],
    }
    return json.dumps(
        {
            "type": "message",
            "attachments": [
                {"contentType": "application/vnd.microsoft.card.adaptive", "content": card}
            ],
        }
    ).encode()


def email(event: AlertEvent) -> tuple[str, str]:
    """An email's subject and plain-text body."""
    title, lines = message(event)
    body = "\n".join([*lines, "", f"Event {event.uid} ({event.type}, version {event.version})."])
    return f"[llm_budgets] {title}", body
