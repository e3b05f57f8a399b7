"""A fake Stripe API server with real state, for the real ``stripe`` package on 127.0.0.1.

It implements what llm_budgets uses of Stripe's API, with Stripe's rules: meters (one per event
name), prices, customers, meter events (identifier unique over 24 h, timestamp at most 35 days
old and 5 minutes ahead, string values of at most 15 significant digits, known customers),
cancel adjustments (within 24 h of receipt), event summaries (per hour or whole range, paginated)
and Idempotency-Key replay; for prepaid credits, Checkout sessions (``pay_checkout`` returns the
events Stripe would send), off-session payment intents (``decline`` a customer's card), credit
grants (create, retrieve, list, void; ``apply_credit`` draws on them as an invoice would, in
Stripe's order, and records each draw as a credit balance transaction of its grant) and credit
balance summaries (per customer or per grant), refunds and disputes (opened and closed) as
events. Faults are injected per request path:

- ``"500"`` / ``"429"``: answer with that status;
- ``"drop_before"``: close the connection without processing;
- ``"drop_after"``: process (record the event), then close without answering.

``on_record`` (a callable) runs after an event is recorded and before the answer, so a test can
kill the sender between Stripe recording an event and the sender recording that.

Start: ``with StripeServer() as fake: ... fake.base_url``. ``demo/`` uses it too.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from llm_budgets.testing.fakes.server import serve_in_background

DAY = 24 * 60 * 60


def parse_form(text: str) -> dict[str, Any]:
    """Stripe's form encoding (``a[b]=1``, ``a[0]=x``, ``a[]=x``) into nested dicts/lists."""
    result: dict[str, Any] = {}
    for key, value in parse_qsl(text, keep_blank_values=True):
        parts = re.findall(r"[^\[\]]+|\[\]", key)
        node: Any = result
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = None if last else parts[i + 1]
            as_list = nxt is not None and (nxt == "[]" or nxt.isdigit())
            if isinstance(node, list):
                if last:
                    node.append(value)
                    break
                if part.isdigit() and int(part) < len(node):
                    node = node[int(part)]
                    continue
                node.append([] if as_list else {})
                node = node[-1]
                continue
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, [] if as_list else {})
    return result


@dataclass
class MeterEvent:
    identifier: str
    event_name: str
    customer: str
    value: Decimal
    timestamp: int
    received: float
    cancelled: bool = False


@dataclass
class State:
    meters: dict[str, dict[str, Any]] = field(default_factory=dict)
    prices: dict[str, dict[str, Any]] = field(default_factory=dict)
    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[MeterEvent] = field(default_factory=list)
    adjustments: list[dict[str, Any]] = field(default_factory=list)
    v2_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkout_sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    payment_intents: dict[str, dict[str, Any]] = field(default_factory=dict)
    credit_grants: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Credit invoices drew from each grant (``apply_credit``), in minor units, and the credit
    # balance transactions that record it.
    credit_applied: dict[str, int] = field(default_factory=dict)
    credit_transactions: list[dict[str, Any]] = field(default_factory=list)
    # Customers whose saved card declines off-session charges (``decline``).
    declining: set[str] = field(default_factory=set)
    idempotency: dict[str, tuple[str, int, bytes]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)


class StripeError(Exception):
    def __init__(
        self, status: int, message: str, *, code: str = "", kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind


class StripeServer:
    """Thread-backed fake; ``clock`` gives "now" in unix seconds (tests may move it)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.state = State()
        self.faults: dict[str, list[str]] = defaultdict(list)
        self.on_record: Callable[[MeterEvent], None] | None = None
        # Seconds each request waits before it is handled (to make concurrent senders overlap).
        self.delay = 0.0
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> StripeServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = serve_in_background(self._server)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> StripeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    # -- test helpers
    def inject(self, path: str, *faults: str) -> None:
        """Queue faults for the next requests to ``path`` (e.g. "/v1/billing/meter_events")."""
        with self.lock:
            self.faults[path].extend(faults)

    def add_customer(self, customer_id: str | None = None, **fields: Any) -> str:
        with self.lock:
            cid = customer_id or f"cus_{secrets.token_hex(7)}"
            self.state.customers[cid] = {"id": cid, "object": "customer", **fields}
            return cid

    def live_events(self, customer: str | None = None) -> list[MeterEvent]:
        with self.lock:
            return [
                e
                for e in self.state.events
                if not e.cancelled and (customer is None or e.customer == customer)
            ]

    def total(self, customer: str, event_name: str | None = None) -> Decimal:
        return sum(
            (
                e.value
                for e in self.live_events(customer)
                if event_name is None or e.event_name == event_name
            ),
            Decimal(0),
        )

    # -- prepaid: what Stripe would send the webhook after a payment, refund or dispute
    def pay_checkout(
        self, session_id: str, *, payment_method: str = "pm_card_visa"
    ) -> list[dict[str, Any]]:
        """The customer pays a Checkout session: its payment intent succeeds. The two events
        Stripe then sends (``checkout.session.completed``, ``payment_intent.succeeded``)."""
        with self.lock:
            session = self.state.checkout_sessions[session_id]
            intent = self._intent(
                customer=session["customer"],
                amount=session["amount_total"],
                currency=session["currency"],
                metadata=dict(session["payment_intent_metadata"]),
                payment_method=payment_method,
            )
            session.update(status="complete", payment_status="paid", payment_intent=intent["id"])
            self.state.customers[session["customer"]]["saved_payment_method"] = payment_method
            public = {k: v for k, v in session.items() if k != "payment_intent_metadata"}
            return [
                self._event("checkout.session.completed", public),
                self._event("payment_intent.succeeded", intent),
            ]

    def refund(self, intent_id: str, amount: int) -> dict[str, Any]:
        """Refund ``amount`` (minor units) more of a payment: the ``charge.refunded`` event."""
        with self.lock:
            intent = self.state.payment_intents[intent_id]
            intent["amount_refunded"] = min(intent["amount"], intent["amount_refunded"] + amount)
            charge = {
                "id": intent["latest_charge"],
                "object": "charge",
                "payment_intent": intent_id,
                "customer": intent["customer"],
                "amount": intent["amount"],
                "amount_refunded": intent["amount_refunded"],
                "currency": intent["currency"],
                "refunded": intent["amount_refunded"] == intent["amount"],
            }
            return self._event("charge.refunded", charge)

    def dispute(self, intent_id: str, amount: int) -> dict[str, Any]:
        with self.lock:
            intent = self.state.payment_intents[intent_id]
            dispute = {
                "id": f"dp_{secrets.token_hex(7)}",
                "object": "dispute",
                "charge": intent["latest_charge"],
                "payment_intent": intent_id,
                "amount": amount,
                "currency": intent["currency"],
                "status": "needs_response",
            }
            return self._event("charge.dispute.created", dispute)

    def decline(self, customer: str) -> None:
        """The customer's saved card declines off-session charges from now on."""
        with self.lock:
            self.state.declining.add(customer)

    def dispute_close(self, dispute: dict[str, Any], status: str) -> dict[str, Any]:
        """Close a dispute (``dispute`` is a ``charge.dispute.created`` event): ``won``,
        ``lost`` or ``warning_closed``. The ``charge.dispute.closed`` event."""
        with self.lock:
            closed = {**dispute["data"]["object"], "status": status}
            return self._event("charge.dispute.closed", closed)

    def apply_credit(self, customer: str, amount: int) -> int:
        """An invoice drew up to ``amount`` (minor units) from the customer's live credit
        grants, highest priority (lowest number) first, then oldest; returns what it drew."""
        with self.lock:
            now, left = self.clock(), amount
            grants = sorted(
                (g for g in self.state.credit_grants.values() if g["customer"] == customer),
                key=lambda g: (g["priority"], g["created"], g["id"]),
            )
            for grant in grants:
                take = min(left, self._remaining(grant, now))
                if take <= 0:
                    continue
                left -= take
                self.state.credit_applied[grant["id"]] = (
                    self.state.credit_applied.get(grant["id"], 0) + take
                )
                money = {"currency": grant["amount"]["monetary"]["currency"], "value": take}
                self.state.credit_transactions.append(
                    {
                        "id": f"cbtxn_{secrets.token_hex(8)}",
                        "object": "billing.credit_balance_transaction",
                        "created": int(now),
                        "credit_grant": grant["id"],
                        "type": "debit",
                        "debit": {
                            "type": "credits_applied",
                            "amount": {"type": "monetary", "monetary": money},
                        },
                        "credit": None,
                    }
                )
            return amount - left

    def _remaining(self, grant: dict[str, Any], now: float) -> int:
        """What is left to apply of a grant: 0 once voided or expired."""
        if grant["voided_at"] is not None:
            return 0
        if grant["expires_at"] is not None and grant["expires_at"] <= now:
            return 0
        value = int(grant["amount"]["monetary"]["value"])
        return value - self.state.credit_applied.get(grant["id"], 0)

    def live_grants(self, customer: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                g
                for g in self.state.credit_grants.values()
                if g["voided_at"] is None and (customer is None or g["customer"] == customer)
            ]

    def _event(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"evt_{secrets.token_hex(8)}",
            "object": "event",
            "type": kind,
            "created": int(self.clock()),
            "data": {"object": json.loads(json.dumps(obj))},
        }

    def _intent(
        self,
        *,
        customer: str,
        amount: int,
        currency: str,
        metadata: dict[str, Any],
        payment_method: str,
        status: str = "succeeded",
    ) -> dict[str, Any]:
        pid = f"pi_{secrets.token_hex(8)}"
        intent: dict[str, Any] = {
            "id": pid,
            "object": "payment_intent",
            "amount": amount,
            "amount_received": amount if status == "succeeded" else 0,
            "amount_refunded": 0,
            "currency": currency,
            "customer": customer,
            "metadata": metadata,
            "payment_method": payment_method,
            "latest_charge": f"ch_{secrets.token_hex(8)}",
            "status": status,
        }
        self.state.payment_intents[pid] = intent
        return intent

    # -- routing
    def handle(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        routes: list[tuple[str, str, Callable[..., dict[str, Any]]]] = [
            ("POST", r"/v1/billing/meters", self._meter_create),
            ("GET", r"/v1/billing/meters", self._meter_list),
            ("GET", r"/v1/billing/meters/(?P<mid>[^/]+)/event_summaries", self._summaries),
            ("GET", r"/v1/billing/meters/(?P<mid>[^/]+)", self._meter_get),
            ("POST", r"/v1/billing/meter_events", self._event_create),
            ("POST", r"/v1/billing/meter_event_adjustments", self._adjustment_create),
            ("POST", r"/v1/prices", self._price_create),
            ("GET", r"/v1/prices", self._price_list),
            ("POST", r"/v1/customers", self._customer_create),
            ("GET", r"/v1/customers/(?P<cid>[^/]+)", self._customer_get),
            ("DELETE", r"/v1/customers/(?P<cid>[^/]+)", self._customer_delete),
            ("GET", r"/v2/core/events/(?P<eid>[^/]+)", self._v2_event_get),
            ("POST", r"/v1/checkout/sessions", self._checkout_create),
            ("GET", r"/v1/checkout/sessions/(?P<sid>[^/]+)", self._checkout_get),
            ("POST", r"/v1/payment_intents", self._intent_create),
            ("POST", r"/v1/billing/credit_grants", self._grant_create),
            ("GET", r"/v1/billing/credit_grants", self._grant_list),
            ("POST", r"/v1/billing/credit_grants/(?P<gid>[^/]+)/void", self._grant_void),
            ("GET", r"/v1/billing/credit_grants/(?P<gid>[^/]+)", self._grant_get),
            ("GET", r"/v1/billing/credit_balance_transactions", self._transactions),
            ("GET", r"/v1/billing/credit_balance_summary", self._balance_summary),
        ]
        for verb, pattern, view in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                return view(params, **match.groupdict())
        raise StripeError(404, f"Unrecognized request URL ({method}: {path}).")

    def _meter_create(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p.get("event_name", "")
        if not name or len(name) > 100:
            raise StripeError(400, "Invalid event_name.", code="parameter_invalid_string")
        if any(m["event_name"] == name for m in self.state.meters.values()):
            raise StripeError(
                400, f"A meter with event_name {name} already exists.", code="parameter_invalid"
            )
        formula = (p.get("default_aggregation") or {}).get("formula")
        if formula not in ("sum", "count", "last"):
            raise StripeError(400, "Invalid default_aggregation[formula].")
        mid = f"mtr_{secrets.token_hex(8)}"
        mapping = p.get("customer_mapping") or {
            "type": "by_id",
            "event_payload_key": "stripe_customer_id",
        }
        meter = {
            "id": mid,
            "object": "billing.meter",
            "event_name": name,
            "display_name": p.get("display_name", name),
            "default_aggregation": {"formula": formula},
            "customer_mapping": mapping,
            "value_settings": p.get("value_settings") or {"event_payload_key": "value"},
            "status": "active",
            "created": int(self.clock()),
            "livemode": False,
        }
        self.state.meters[mid] = meter
        return meter

    def _meter_list(self, p: dict[str, Any]) -> dict[str, Any]:
        meters = [
            m
            for m in self.state.meters.values()
            if not p.get("status") or m["status"] == p["status"]
        ]
        return {"object": "list", "data": meters, "has_more": False, "url": "/v1/billing/meters"}

    def _meter_get(self, p: dict[str, Any], mid: str) -> dict[str, Any]:
        if mid not in self.state.meters:
            raise StripeError(404, f"No such billing meter: '{mid}'", code="resource_missing")
        return self.state.meters[mid]

    def _meter_by_event(self, name: str) -> dict[str, Any] | None:
        return next((m for m in self.state.meters.values() if m["event_name"] == name), None)

    def _event_create(self, p: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        name = p.get("event_name", "")
        meter = self._meter_by_event(name)
        if meter is None:
            raise StripeError(400, f"No active meter was found for event_name {name}.")
        payload = p.get("payload") or {}
        customer = payload.get("stripe_customer_id", "")
        if customer not in self.state.customers:
            raise StripeError(400, f"No such customer: '{customer}'", code="resource_missing")
        raw = payload.get("value", "")
        try:
            value = Decimal(raw)
        except InvalidOperation:
            raise StripeError(400, f"Invalid value {raw!r}.", code="parameter_invalid") from None
        digits = value.as_tuple().digits
        if not value.is_finite() or len(str(int("".join(map(str, digits)) or 0))) > 15:
            raise StripeError(
                400, "Values can have at most 15 significant digits.", code="parameter_invalid"
            )
        timestamp = int(p.get("timestamp") or now)
        if timestamp < now - 35 * DAY:
            raise StripeError(
                400, "Timestamp must be within the past 35 days.", code="timestamp_too_far_in_past"
            )
        if timestamp > now + 5 * 60:
            raise StripeError(
                400,
                "Timestamp must not be more than 5 minutes in the future.",
                code="timestamp_in_future",
            )
        identifier = p.get("identifier") or f"auto_{secrets.token_hex(8)}"
        if len(identifier) > 100:
            raise StripeError(400, "identifier is too long.")
        for event in self.state.events:
            if event.identifier == identifier and event.received > now - DAY:
                raise StripeError(400, f"An event already exists with identifier {identifier}.")
        event = MeterEvent(identifier, name, customer, value, timestamp, now)
        self.state.events.append(event)
        if self.on_record is not None:
            self.on_record(event)
        return {
            "object": "billing.meter_event",
            "event_name": name,
            "identifier": identifier,
            "payload": payload,
            "timestamp": timestamp,
            "created": int(now),
            "livemode": False,
        }

    def _adjustment_create(self, p: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        if p.get("type") != "cancel":
            raise StripeError(400, "Only type=cancel is supported.")
        identifier = (p.get("cancel") or {}).get("identifier", "")
        event = next(
            (
                e
                for e in self.state.events
                if e.identifier == identifier and e.event_name == p.get("event_name")
            ),
            None,
        )
        if event is None:
            raise StripeError(400, f"No meter event with identifier {identifier}.")
        if event.received < now - DAY:
            raise StripeError(
                400, "Meter events can only be cancelled within 24 hours of being received."
            )
        event.cancelled = True
        adjustment = {
            "object": "billing.meter_event_adjustment",
            "event_name": event.event_name,
            "type": "cancel",
            "cancel": {"identifier": identifier},
            "status": "complete",
            "livemode": False,
        }
        self.state.adjustments.append(adjustment)
        return adjustment

    def _summaries(self, p: dict[str, Any], mid: str) -> dict[str, Any]:
        meter = self.state.meters.get(mid)
        if meter is None:
            raise StripeError(404, f"No such billing meter: '{mid}'", code="resource_missing")
        start, end = int(p["start_time"]), int(p["end_time"])
        window = {"hour": 3600, "day": DAY}.get(p.get("value_grouping_window", ""), 0)
        if start % 60 or end % 60 or (window and (start % window or end % window)):
            raise StripeError(400, "start_time and end_time must be aligned.")
        buckets: dict[int, Decimal] = defaultdict(Decimal)
        for e in self.state.events:
            if (
                e.cancelled
                or e.customer != p.get("customer")
                or e.event_name != meter["event_name"]
                or not start <= e.timestamp < end
            ):
                continue
            key = start + (e.timestamp - start) // window * window if window else start
            buckets[key] += e.value
        data = [
            {
                "id": f"mtrusg_{mid}_{key}",
                "object": "billing.meter_event_summary",
                "aggregated_value": float(buckets[key]),
                "start_time": key,
                "end_time": key + window if window else end,
                "meter": mid,
                "livemode": False,
            }
            for key in sorted(buckets)
        ]
        after = p.get("starting_after")
        if after:
            index = next(i for i, d in enumerate(data) if d["id"] == after)
            data = data[index + 1 :]
        limit = min(int(p.get("limit", 10)), 100)
        return {
            "object": "list",
            "data": data[:limit],
            "has_more": len(data) > limit,
            "url": f"/v1/billing/meters/{mid}/event_summaries",
        }

    def _price_create(self, p: dict[str, Any]) -> dict[str, Any]:
        recurring = p.get("recurring") or {}
        if recurring.get("usage_type") == "metered" and recurring.get("meter") not in (
            self.state.meters
        ):
            raise StripeError(400, "A metered price must name an existing meter.")
        pid = f"price_{secrets.token_hex(8)}"
        price = {
            "id": pid,
            "object": "price",
            "currency": p.get("currency"),
            "unit_amount_decimal": p.get("unit_amount_decimal"),
            "lookup_key": p.get("lookup_key"),
            "recurring": recurring,
            "product": p.get("product") or {"name": (p.get("product_data") or {}).get("name")},
            "active": True,
        }
        self.state.prices[pid] = price
        return price

    def _price_list(self, p: dict[str, Any]) -> dict[str, Any]:
        keys = p.get("lookup_keys") or []
        data = [x for x in self.state.prices.values() if not keys or x["lookup_key"] in keys]
        return {"object": "list", "data": data, "has_more": False, "url": "/v1/prices"}

    def _customer_create(self, p: dict[str, Any]) -> dict[str, Any]:
        cid = self.add_customer(**{k: v for k, v in p.items() if k in ("name", "email")})
        return self.state.customers[cid]

    def _customer_get(self, p: dict[str, Any], cid: str) -> dict[str, Any]:
        if cid not in self.state.customers:
            raise StripeError(404, f"No such customer: '{cid}'", code="resource_missing")
        return self.state.customers[cid]

    def _customer_delete(self, p: dict[str, Any], cid: str) -> dict[str, Any]:
        self._customer_get(p, cid)
        del self.state.customers[cid]
        return {"id": cid, "object": "customer", "deleted": True}

    def _customer(self, p: dict[str, Any]) -> str:
        customer = p.get("customer") or ""
        if customer not in self.state.customers:
            raise StripeError(400, f"No such customer: '{customer}'", code="resource_missing")
        return str(customer)

    @staticmethod
    def _positive_int(value: Any, name: str) -> int:
        if not isinstance(value, str) or not value.isdigit() or int(value) <= 0:
            raise StripeError(
                400, f"Invalid positive integer: {name}", code="parameter_invalid_integer"
            )
        return int(value)

    def _checkout_create(self, p: dict[str, Any]) -> dict[str, Any]:
        if p.get("mode") != "payment":
            raise StripeError(
                400, "This fake takes mode=payment only.", code="parameter_invalid_empty"
            )
        customer = self._customer(p)
        items = p.get("line_items")
        if not isinstance(items, list) or len(items) != 1:
            raise StripeError(400, "line_items: one item expected.", code="parameter_missing")
        data = items[0].get("price_data") or {}
        amount = self._positive_int(
            data.get("unit_amount"), "line_items[0][price_data][unit_amount]"
        )
        quantity = self._positive_int(items[0].get("quantity"), "line_items[0][quantity]")
        if not (data.get("product_data") or {}).get("name"):
            raise StripeError(
                400,
                "Missing required param: line_items[0][price_data][product_data][name].",
                code="parameter_missing",
            )
        for key in ("success_url", "currency"):
            if not (p.get(key) if key != "currency" else data.get("currency")):
                raise StripeError(400, f"Missing required param: {key}.", code="parameter_missing")
        intent_data = p.get("payment_intent_data") or {}
        if intent_data.get("setup_future_usage") not in (None, "on_session", "off_session"):
            raise StripeError(400, "Invalid setup_future_usage.", code="parameter_invalid_empty")
        sid = f"cs_test_{secrets.token_hex(12)}"
        session = {
            "id": sid,
            "object": "checkout.session",
            "mode": "payment",
            "customer": customer,
            "client_reference_id": p.get("client_reference_id"),
            "metadata": p.get("metadata") or {},
            "amount_total": amount * quantity,
            "currency": data["currency"],
            "payment_status": "unpaid",
            "payment_intent": None,
            "status": "open",
            "url": f"https://checkout.stripe.test/c/pay/{sid}",
            "success_url": p["success_url"],
            "payment_intent_metadata": intent_data.get("metadata") or {},
        }
        self.state.checkout_sessions[sid] = session
        return {k: v for k, v in session.items() if k != "payment_intent_metadata"}

    def _checkout_get(self, p: dict[str, Any], sid: str) -> dict[str, Any]:
        if sid not in self.state.checkout_sessions:
            raise StripeError(404, f"No such checkout.session: '{sid}'", code="resource_missing")
        session = self.state.checkout_sessions[sid]
        return {k: v for k, v in session.items() if k != "payment_intent_metadata"}

    def _intent_create(self, p: dict[str, Any]) -> dict[str, Any]:
        customer = self._customer(p)
        amount = self._positive_int(p.get("amount"), "amount")
        if not p.get("currency"):
            raise StripeError(400, "Missing required param: currency.", code="parameter_missing")
        method = p.get("payment_method")
        if p.get("off_session") != "true" or p.get("confirm") != "true" or not method:
            raise StripeError(
                400,
                "This fake takes confirmed off-session payments with a payment_method only.",
                code="parameter_missing",
            )
        if method != self.state.customers[customer].get("saved_payment_method"):
            raise StripeError(
                400,
                f"No such PaymentMethod: '{method}' for this customer.",
                code="resource_missing",
            )
        declined = customer in self.state.declining
        intent = self._intent(
            customer=customer,
            amount=amount,
            currency=p["currency"],
            metadata=p.get("metadata") or {},
            payment_method=str(method),
            status="requires_payment_method" if declined else "succeeded",
        )
        if declined:
            raise StripeError(
                402, "Your card was declined.", code="card_declined", kind="card_error"
            )
        return intent

    def _grant_create(self, p: dict[str, Any]) -> dict[str, Any]:
        customer = self._customer(p)
        amount = p.get("amount") or {}
        monetary = amount.get("monetary") or {}
        if amount.get("type") != "monetary" or not monetary.get("currency"):
            raise StripeError(
                400,
                "amount[type] must be monetary with a currency.",
                code="parameter_invalid_empty",
            )
        value = self._positive_int(monetary.get("value"), "amount[monetary][value]")
        scope = (p.get("applicability_config") or {}).get("scope") or {}
        if scope.get("price_type") != "metered" and not scope.get("prices"):
            raise StripeError(
                400,
                "Missing required param: applicability_config[scope].",
                code="parameter_missing",
            )
        category = p.get("category", "paid")
        if category not in ("paid", "promotional"):
            raise StripeError(400, f"Invalid category: {category}", code="parameter_invalid_empty")
        priority = int(p.get("priority", "50"))
        if not 0 <= priority <= 100:
            raise StripeError(400, "priority must be 0 to 100.", code="parameter_invalid_integer")
        gid = f"credgr_{secrets.token_hex(10)}"
        grant = {
            "id": gid,
            "object": "billing.credit_grant",
            "customer": customer,
            "category": category,
            "priority": priority,
            "amount": {
                "type": "monetary",
                "monetary": {"currency": monetary["currency"], "value": value},
            },
            "applicability_config": {"scope": scope},
            "expires_at": int(p["expires_at"]) if p.get("expires_at") else None,
            "metadata": p.get("metadata") or {},
            "name": p.get("name"),
            "voided_at": None,
            "created": int(self.clock()),
        }
        self.state.credit_grants[gid] = grant
        return grant

    def _grant_list(self, p: dict[str, Any]) -> dict[str, Any]:
        customer = p.get("customer")
        data = [g for g in self.state.credit_grants.values() if customer in (None, g["customer"])]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "url": "/v1/billing/credit_grants",
        }

    def _grant_get(self, p: dict[str, Any], gid: str) -> dict[str, Any]:
        if gid not in self.state.credit_grants:
            raise StripeError(404, f"No such credit grant: '{gid}'", code="resource_missing")
        return self.state.credit_grants[gid]

    def _grant_void(self, p: dict[str, Any], gid: str) -> dict[str, Any]:
        grant = self._grant_get(p, gid)
        if grant["voided_at"] is not None:
            raise StripeError(400, f"Credit grant {gid} is already voided.", code="invalid_state")
        grant["voided_at"] = int(self.clock())
        return grant

    def _transactions(self, p: dict[str, Any]) -> dict[str, Any]:
        gid = p.get("credit_grant")
        if not gid and not p.get("customer"):
            raise StripeError(400, "Missing required param: customer.", code="parameter_missing")
        data = [
            t
            for t in self.state.credit_transactions
            if (not gid or t["credit_grant"] == gid)
            and (
                not p.get("customer")
                or self.state.credit_grants[t["credit_grant"]]["customer"] == p["customer"]
            )
        ]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "url": "/v1/billing/credit_balance_transactions",
        }

    def _balance_summary(self, p: dict[str, Any]) -> dict[str, Any]:
        customer = self._customer(p)
        if (p.get("filter") or {}).get("type") not in ("applicability_scope", "credit_grant"):
            raise StripeError(
                400, "Missing required param: filter[type].", code="parameter_missing"
            )
        now = self.clock()
        only = ((p.get("filter") or {}).get("credit_grant") or {}).get("credit_grant")
        by_currency: dict[str, int] = {}
        for grant in self.state.credit_grants.values():
            if grant["customer"] != customer or only not in (None, grant["id"]):
                continue
            currency = grant["amount"]["monetary"]["currency"]
            by_currency[currency] = by_currency.get(currency, 0) + self._remaining(grant, now)
        balances = []
        for currency, left in by_currency.items():
            amount = {"type": "monetary", "monetary": {"currency": currency, "value": left}}
            balances.append({"available_balance": amount, "ledger_balance": amount})
        return {
            "object": "billing.credit_balance_summary",
            "customer": customer,
            "balances": balances,
            "livemode": False,
        }

    def _v2_event_get(self, p: dict[str, Any], eid: str) -> dict[str, Any]:
        if eid not in self.state.v2_events:
            raise StripeError(404, f"No such event: '{eid}'", code="resource_missing")
        return self.state.v2_events[eid]


class _Handler(BaseHTTPRequestHandler):
    fake: StripeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _answer(
        self, status: int, body: dict[str, Any], extra: dict[str, str] | None = None
    ) -> bytes:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", f"req_{secrets.token_hex(7)}")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        return data

    def _serve(self, method: str) -> None:
        fake = self.fake
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        params = parse_form(body if method == "POST" else url.query)
        if fake.delay:
            time.sleep(fake.delay)
        with fake.lock:
            fake.state.requests.append((method, url.path))
            queue = fake.faults.get(url.path)
            fault = queue.pop(0) if queue else None
        if not (self.headers.get("Authorization") or "").startswith("Bearer sk_"):
            self._answer(
                401,
                {
                    "error": {
                        "type": "invalid_request_error",
                        "message": "Invalid API Key provided.",
                    }
                },
            )
            return
        if fault == "drop_before":
            self._drop()
            return
        if fault in ("500", "429"):
            message = "Too many requests" if fault == "429" else "An unknown error occurred"
            kind = "rate_limit_error" if fault == "429" else "api_error"
            self._answer(int(fault), {"error": {"type": kind, "message": message}})
            return
        key = self.headers.get("Idempotency-Key")
        with fake.lock:
            if method == "POST" and key and key in fake.state.idempotency:
                seen_body, status, data = fake.state.idempotency[key]
                if seen_body != body:
                    self._answer(
                        400,
                        {
                            "error": {
                                "type": "idempotency_error",
                                "message": "Keys for idempotent requests can only be used with the "
                                "same parameters they were first used with.",
                            }
                        },
                    )
                    return
                if fault == "drop_after":
                    self._drop()
                    return
                self._answer(status, json.loads(data), {"Idempotent-Replayed": "true"})
                return
            try:
                status, result = 200, fake.handle(method, url.path, params)
            except StripeError as exc:
                status = exc.status
                result = {"error": {"type": exc.kind, "message": exc.message, "code": exc.code}}
            if method == "POST" and key and status < 500:
                fake.state.idempotency[key] = (body, status, json.dumps(result).encode())
        if fault == "drop_after":
            self._drop()
            return
        headers = {"Stripe-Should-Retry": "false"} if status == 400 else {}
        self._answer(status, result, headers)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")
