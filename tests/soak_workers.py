"""The soak's workers (tests/test_faults_soak.py): random operations through the in-process API
(``api_worker``, a forked process on the fault proxy) and through REST (``rest_worker``, a forked
process calling the web processes, which reach the database through the same proxy).

Each worker tallies how every operation ended and appends each answered operation to its journal
(one JSON line, flushed at once, so that a worker SIGKILLed mid-run leaves what it was told):
tests/soak_checks.py checks the ledger against the journals at the end. An operation whose answer
was lost (``ledger_unavailable``, a database error, a 5xx, a connection error) is retried with the
same request and idempotency key, as the errors ask, up to ``RETRIES`` times; the tally says how
many answers came only on a retry. Every ``PROGRESS_EVERY`` operations a worker writes its
progress and tally to ``var/faults-soak-progress-<name>.json``."""

from __future__ import annotations

import json
import random
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
from django.db import DatabaseError, connection
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.billing.credits import account_of, balance_adjust, credit_add
from llm_budgets.client import error_from_response
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine import settlement
from llm_budgets.engine.adjustments import end_user_spend_reset, usage_void
from llm_budgets.exceptions import BudgetError, BudgetExceeded, LedgerUnavailable
from llm_budgets.models import Budget, EndUser, UsageKind, UsageRecord
from llm_budgets.usage import input_allowed
from tests.api import BASE
from tests.concurrency import refused_early, worst_case

T = TypeVar("T")

PROGRESS_EVERY = 50
STOP_FILE = "faults-soak-stop"  # touched in var/: a long run ends early, checked
RETRIES = 3
END_USERS = [f"u{n}" for n in range(8)]
# The soak's model: input and output at 0.03 a token, so the input tolerance costs something.
MODEL, RATE = "soak", Decimal(30000)
POSTPAID, PREPAID = "acme", "prepay"
# The limits staff may set on each end user's day budget ("*"): the check holds counters to the
# highest, since a change whose answer was lost may have applied.
END_USER_LIMITS = ("350", "400", "450")


def worst(request: dict[str, Any]) -> Decimal:
    """What a request holds: its input, the input tolerance and its output ceiling (#38)."""
    return worst_case(
        input_tokens=request["input_tokens"],
        max_output_tokens=request["max_output_tokens"],
        input_per_mtok=RATE,
        output_per_mtok=RATE,
    )


@dataclass
class Worker:
    """A worker's state: its random stream, tally, journal, open holds and answered keys."""

    name: str
    seed: int
    var: Path
    rng: random.Random = field(init=False)
    tally: Tally[str] = field(default_factory=Tally)  # how each operation ended, one each
    seen: Tally[str] = field(default_factory=Tally)  # lost answers and retries, per attempt
    journal: IO[str] = field(init=False)
    open_holds: list[tuple[str, int]] = field(default_factory=list)  # (id, input tokens held)
    sent: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    sent_order: list[str] = field(default_factory=list)  # the keys of sent, to draw from
    owners: dict[str, str] = field(default_factory=dict)  # hold id: its tenant
    committed: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.journal = (self.var / f"faults-soak-journal-{self.name}.jsonl").open("a")

    def record(self, **entry: Any) -> None:
        self.journal.write(json.dumps(entry) + "\n")
        self.journal.flush()

    def next_op(self, n: int, of: int, weights: dict[str, int]) -> str | None:
        """The ``n``-th operation drawn by ``weights`` (progress written every
        ``PROGRESS_EVERY``), or None where it needs an open hold and there is none (tallied)."""
        if n % PROGRESS_EVERY == 0:
            self.progress(n, of)
        op = self.rng.choices(list(weights), weights=list(weights.values()))[0]
        if op in ("commit", "release", "extend") and not self.open_holds:
            self.tally[f"{op} skipped (no open hold)"] += 1
            return None
        return op

    def stop_asked(self, n: int) -> bool:
        """Whether a long run was asked to end early (``STOP_FILE`` in ``var``), looked at on
        each progress mark: the worker stops there, and every check runs over what was done."""
        return n % PROGRESS_EVERY == 0 and (self.var / STOP_FILE).exists()

    def progress(self, done: int, of: int) -> None:
        seconds = round(time.monotonic() - self.started, 1)
        (self.var / f"faults-soak-progress-{self.name}.json").write_text(
            json.dumps(
                {
                    "operations": done,
                    "of": of,
                    "seconds": seconds,
                    "tally": self.tally,
                    "seen": self.seen,
                }
            )
        )

    def request(self) -> dict[str, Any]:
        prepaid = self.rng.random() < 0.3
        return {
            "tenant": PREPAID if prepaid else POSTPAID,
            "end_user": None if prepaid else self.rng.choice(END_USERS),
            "provider": "fake",
            "model": MODEL,
            "input_tokens": self.rng.randint(0, 40),
            "max_output_tokens": self.rng.randint(1, 1000),
            "ttl": self.rng.randint(1, 60),
        }

    def usage(self, held_input: int) -> tuple[int, int]:
        """Input up to the tolerance (within the rule: never over the hold); output under the
        ceiling and over it (refused, usage_exceeds_hold)."""
        return self.rng.randint(0, input_allowed(held_input)), self.rng.randint(0, 1500)


# -- the in-process API ------------------------------------------------------------------------

API_OPS = {
    "reserve": 34,
    "retry": 6,
    "commit": 20,
    "release": 10,
    "extend": 4,
    "sweep": 5,
    "status": 2,
    "trip": 4,
    "raise": 4,
    "reset": 1,
    "set_limit": 2,
    "void": 1,
    "top_up": 4,
    "credit_remove": 2,
}
# Staff actions that always write an audit event when answered (tests/soak_checks.py).
WRITES = {"raise", "void", "top_up", "credit_remove"}


def _answered(worker: Worker, op: str, call: Callable[[], T]) -> T:
    """``call``, retried as the errors ask when its answer was lost; raises the last loss."""
    for attempt in range(RETRIES + 1):
        try:
            result = call()
        except (LedgerUnavailable, DatabaseError) as exc:
            kind = "ledger_unavailable" if isinstance(exc, LedgerUnavailable) else "database_error"
            worker.seen[f"{op} {kind}"] += 1
            connection.close()
            if attempt == RETRIES:
                raise
            time.sleep(0.05 * (attempt + 1))
            continue
        if attempt:
            worker.seen[f"{op} answered on retry {attempt}"] += 1
        return result
    raise AssertionError("unreachable")


def api_worker(name: str, seed: int, var: Path, proxy_port: int, ops: int) -> dict[str, Any]:
    """``ops`` random operations through the in-process API; returns the tally."""
    connection.settings_dict["PORT"] = proxy_port
    connection.close()
    w = Worker(name, seed, var)
    done = ops
    for n in range(ops):
        if w.stop_asked(n):
            done = n
            break
        op = w.next_op(n, ops, API_OPS)
        if op is None:
            continue
        request: dict[str, Any] | None = None
        reason = f"soak {name} {n} {op}"
        try:
            if op in ("reserve", "retry"):
                if op == "retry" and w.sent:
                    key = w.rng.choice(w.sent_order)
                    request, first = w.sent[key]
                    if w.rng.random() < 0.1:  # the key reused for another request: refused
                        op = "retry (changed)"
                        request = {**request, "max_output_tokens": request["max_output_tokens"] + 1}
                else:
                    op, key, request = "reserve", f"{name}-{n}", w.request()
                    first = None
                hold = _answered(w, op, partial(budgets.reserve, **request, idempotency_key=key))
                hold_id = str(hold.id)
                if first is not None and hold_id != first:
                    w.seen["retry answered another reservation"] += 1
                if first is None:
                    w.sent[key] = (request, hold_id)
                    w.sent_order.append(key)
                    w.open_holds.append((hold_id, request["input_tokens"]))
                    w.record(op="reserve", key=key, id=hold_id)
            elif op == "commit":
                hold_id, held_input = w.open_holds.pop(w.rng.randrange(len(w.open_holds)))
                tokens_in, tokens_out = w.usage(held_input)
                _answered(
                    w,
                    op,
                    partial(
                        budgets.commit, hold_id, input_tokens=tokens_in, output_tokens=tokens_out
                    ),
                )
                w.record(op="commit", id=hold_id, **{"in": tokens_in, "out": tokens_out})
                w.committed.append(hold_id)
            elif op == "release":
                hold_id = w.open_holds.pop(w.rng.randrange(len(w.open_holds)))[0]
                state = _answered(w, op, partial(budgets.release, hold_id))
                w.record(op="release", id=hold_id, state=str(state))
            elif op == "extend":
                hold_id = w.rng.choice(w.open_holds)[0]
                ttl = w.rng.randint(1, 60)
                _answered(w, op, partial(settlement.reservation_extend, hold_id, ttl=ttl))
            elif op == "sweep":
                # The clock moved ahead: holds whose TTL passed are settled by the sweep.
                at = timezone.now() + timedelta(seconds=w.rng.randint(0, 90))
                budgets.sweep(now=at)
            elif op == "status":
                budgets.status(tenant=POSTPAID, end_user=w.rng.choice(END_USERS))
            else:
                _staff(w, op, reason)
            w.tally[f"{op} ok"] += 1
        except LedgerUnavailable:
            w.tally[f"{op} unanswered (ledger_unavailable)"] += 1
        except OwnReadCut:
            w.tally[f"{op} not sent (the soak's own read was cut)"] += 1
        except DatabaseError:
            # The app raised the database's own error, not LedgerUnavailable (#38 item 7): the
            # soak fails on it (tests/test_faults_soak.py).
            w.tally[f"{op} unanswered (database_error)"] += 1
            connection.close()
        except (EndUser.DoesNotExist, UsageRecord.DoesNotExist):
            w.tally[f"{op} skipped (nothing to act on yet)"] += 1
        except BudgetExceeded as exc:
            w.tally[f"{op} {exc.code}"] += 1
            if request is not None and refused_early(exc, worst(request)):
                w.seen[f"{op} refused early"] += 1
        except BudgetError as exc:
            w.tally[f"{op} {exc.code}"] += 1
    w.progress(done, ops)
    return {"tally": dict(w.tally), "seen": dict(w.seen), "operations": done}


class OwnReadCut(Exception):
    """A read of the soak's own (the row a staff action acts on) met a fault: not the app's
    answer, so it says nothing of item 7; the action was not sent."""


def _own_read(read: Callable[[], T]) -> T:
    try:
        return read()
    except DatabaseError as exc:
        connection.close()
        raise OwnReadCut from exc


def _staff(w: Worker, op: str, reason: str) -> None:
    """A staff action through its service, journaled with its own reason, answered or not."""
    entry = {"op": "staff", "reason": reason, "writes": op in WRITES, "ack": False}
    w.record(**entry)  # before the call: an unanswered action may still have been applied
    if op == "trip":
        user = w.rng.choice(END_USERS)
        action = budgets.trip if w.rng.random() < 0.5 else budgets.clear
        action(tenant=POSTPAID, end_user=user, reason=reason, actor="soak")
    elif op == "raise":
        # Sizeable raises keep the tenant's budget admitting over a long run, so the soak keeps
        # exercising admission near its limits rather than refusing.
        budget = _own_read(
            lambda: Budget.objects.get(tenant__external_id=POSTPAID, end_user=None, window="month")
        )
        budget_raise_grant(
            budget=budget,
            amount=str(w.rng.randint(5, 200)),
            until=timezone.now() + timedelta(seconds=w.rng.randint(1, 30)),
            reason=reason,
            actor="soak",
        )
    elif op == "reset":
        # Support gives an end user its budget back (adjustment lines, audited).
        user = w.rng.choice(END_USERS)
        row = _own_read(lambda: EndUser.objects.get(tenant__external_id=POSTPAID, external_id=user))
        end_user_spend_reset(end_user=row, reason=reason, actor="soak")
    elif op == "set_limit":
        amount = w.rng.choice(END_USER_LIMITS)
        budgets.set_limit(
            tenant=POSTPAID, end_user="*", amount=amount, window="day", reason=reason, actor="soak"
        )
    elif op == "void":
        if not w.committed:
            raise EndUser.DoesNotExist  # nothing to act on yet
        committed = w.rng.choice(w.committed)
        line = _own_read(
            lambda: UsageRecord.objects.get(reservation_id=committed, kind=UsageKind.CHARGE)
        )
        usage_void(record_id=line.pk, reason=reason, actor="soak")
    elif op == "top_up":
        credit_add(
            account=account_of(PREPAID),
            amount=str(w.rng.randint(1, 30)),
            reason=reason,
            actor="soak",
        )
    elif op == "credit_remove":
        balance_adjust(
            tenant=PREPAID,
            amount=str(w.rng.randint(1, 10)),
            direction="remove",
            reason=reason,
            actor="soak",
        )
    w.record(**{**entry, "ack": True})


# -- REST --------------------------------------------------------------------------------------

REST_OPS = {"reserve": 40, "retry": 8, "commit": 24, "release": 12, "extend": 5, "trip": 4}


def rest_worker(
    name: str, seed: int, var: Path, urls: list[str], keys: dict[str, str], ops: int
) -> dict[str, Any]:
    """``ops`` random operations through REST, over the web processes at ``urls`` (a lost
    answer is retried on another of them); ``keys``: an API key per tenant and ``"operator"``."""
    w = Worker(name, seed, var)
    client = httpx.Client(timeout=30)

    def call(op: str, path: str, body: dict[str, Any], idem: str, key: str) -> httpx.Response:
        """POST, retried with the same Idempotency-Key while the answer is lost (a 5xx, a
        connection refused or cut: the web process was killed, the database cut or stalled)."""
        headers = {"Authorization": f"Api-Key {key}", "Idempotency-Key": idem}
        for attempt in range(RETRIES + 2):
            url = urls[(attempt + w.rng.randrange(len(urls))) % len(urls)]
            try:
                answer = client.post(f"{url}{BASE}{path}", json=body, headers=headers)
            except httpx.HTTPError as exc:
                w.seen[f"{op} {type(exc).__name__}"] += 1
            else:
                if answer.status_code < 500:
                    if attempt:
                        w.seen[f"{op} answered on retry {attempt}"] += 1
                    return answer
                w.seen[f"{op} {answer.status_code}"] += 1
            time.sleep(0.1 * (attempt + 1))
        raise ConnectionError(op)

    done = ops
    for n in range(ops):
        if w.stop_asked(n):
            done = n
            break
        op = w.next_op(n, ops, REST_OPS)
        if op is None:
            continue
        try:
            outcome = _rest_op(w, op, n, call, keys)
        except ConnectionError:
            w.tally[f"{op} unanswered"] += 1
            continue
        w.tally[outcome] += 1
    w.progress(done, ops)
    client.close()
    return {"tally": dict(w.tally), "seen": dict(w.seen), "operations": done}


def _rest_op(
    w: Worker,
    op: str,
    n: int,
    call: Callable[[str, str, dict[str, Any], str, str], httpx.Response],
    keys: dict[str, str],
) -> str:
    """One REST operation; how it ended (``<op> <status>`` or ``<op> <error code>``)."""
    first: str | None = None
    if op == "retry" and w.sent:
        key = w.rng.choice(w.sent_order)
        request, first = w.sent[key]
        if w.rng.random() < 0.1:
            op = "retry (changed)"
            request = {**request, "max_output_tokens": request["max_output_tokens"] + 1}
    elif op in ("reserve", "retry"):
        op, key, request = "reserve", f"{w.name}-{n}", w.request()
    if op.startswith(("reserve", "retry")):
        body = {k: v for k, v in request.items() if k not in ("tenant", "ttl")}
        body["ttl_seconds"] = request["ttl"]
        answer = call(op, "reservations", body, key, keys[request["tenant"]])
        if answer.status_code in (200, 201):
            hold_id = answer.json()["id"]
            if first is not None and hold_id != first:
                w.seen["retry answered another reservation"] += 1
            if first is None:
                w.sent[key] = (request, hold_id)
                w.sent_order.append(key)
                w.open_holds.append((hold_id, request["input_tokens"]))
                w.owners[hold_id] = request["tenant"]
                w.record(op="reserve", key=key, id=hold_id)
            return f"{op} ok"
        refusal = error_from_response(answer)  # the refusal as the shipped client rebuilds it
        if isinstance(refusal, BudgetExceeded) and refused_early(refusal, worst(request)):
            w.seen[f"{op} refused early"] += 1
        return f"{op} {refusal.code}"
    if op == "trip":
        user = w.rng.choice(END_USERS)
        path = "kill-switches" if w.rng.random() < 0.5 else "kill-switches/clear"
        body = {"tenant": POSTPAID, "end_user": user, "reason": f"soak {w.name} {n}"}
        answer = call(op, path, body, f"{w.name}-{n}", keys["operator"])
        return f"{op} {answer.status_code}"
    hold_id, held_input = w.rng.choice(w.open_holds)
    idem = f"{w.name}-{n}"
    if op == "commit":
        tokens_in, tokens_out = w.usage(held_input)
        body = {"input_tokens": tokens_in, "output_tokens": tokens_out}
    else:
        body = {"ttl_seconds": w.rng.randint(1, 60)} if op == "extend" else {}
    owner = keys[w.owners[hold_id]]  # a hold is another tenant's 404
    try:
        answer = call(op, f"reservations/{hold_id}/{op}", body, idem, owner)
    except ConnectionError:
        # Never answered: the settlement may have applied. A client would retry this same
        # request; it never settles the hold again with other usage (a settled reservation
        # answers as it was settled: docs/api.md, ledger_unavailable).
        if op in ("commit", "release"):
            w.open_holds.remove((hold_id, held_input))
        raise
    if answer.status_code == 200 and op in ("commit", "release"):
        w.open_holds.remove((hold_id, held_input))
        if op == "commit":
            w.record(op="commit", id=hold_id, **body_tokens(body))
        else:
            w.record(op="release", id=hold_id, state=answer.json()["state"])
    elif answer.status_code >= 400:
        code = answer.json()["error"]["code"]
        if op in ("commit", "release") and code != "usage_exceeds_hold":
            w.open_holds.remove((hold_id, held_input))
        return f"{op} {code}"
    return f"{op} ok"


def body_tokens(body: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {"in": body["input_tokens"], "out": body["output_tokens"]}
