"""The soak's checks (tests/test_faults_soak.py) of every acknowledged operation recorded exactly
once, read from the workers' journals (tests/soak_workers.py) against the ledger once every
worker has stopped and the sweep has run. Its overspend check is the races' own
(``tests.concurrency.overspent_counters``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.db.models import Count

from llm_budgets.models import (
    AuditEvent,
    Reservation,
    UsageKind,
    UsageRecord,
)
from llm_budgets.money import ZERO


def journal_entries(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every line the workers wrote. A worker SIGKILLed mid-write leaves at most a torn last
    line: skipped (its operation's answer had not been recorded, so nothing is claimed)."""
    entries = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries


def not_exactly_once(entries: list[dict[str, Any]], *, rate: Decimal) -> list[str]:
    """Each acknowledged operation, checked against the ledger:

    - a reservation answered for an idempotency key: exactly one reservation has that key, the
      one answered (retries of the key, answered or not, made no second hold);
    - a commit answered: exactly one line of the reservation records reported usage (a charge,
      or the true-up of an estimate the sweep charged first), with the usage the commit sent,
      and its lines (staff adjustments aside) net to that usage at ``rate`` a token: the
      retries of a lost commit charged nothing more;
    - a release answered: the reservation is in the state answered, and a released one nets to
      nothing (a release after the sweep charged its estimate refunds it, once);
    - a staff action (each with a reason of its own): at most one audit event with its reason,
      and exactly one if it was answered and always writes (a raise, a credit added or removed,
      a void). Trips, clears, limit changes and spend resets that changed nothing write none.
    """
    problems: list[str] = []
    keys = {e["key"]: e["id"] for e in entries if e["op"] == "reserve"}
    found: dict[str, list[str]] = defaultdict(list)
    # All of them, not an IN list: a full-size run journals more keys than a query may bind.
    for key, rid in Reservation.objects.filter(idempotency_key__isnull=False).values_list(
        "idempotency_key", "id"
    ):
        if key is not None and key in keys:
            found[key].append(str(rid))
    for key, rid in keys.items():
        if found.get(key) != [rid]:
            problems.append(f"reserve {key}: answered {rid}, the ledger has {found.get(key)}")
    reported: dict[str, list[tuple[int, int]]] = defaultdict(list)
    net: dict[str, Decimal] = defaultdict(Decimal)
    lines = UsageRecord.objects.filter(kind__in=[UsageKind.CHARGE, UsageKind.TRUE_UP])
    for rid, estimated, tokens_in, tokens_out, cost in lines.values_list(
        "reservation_id", "is_estimated", "input_tokens", "output_tokens", "cost"
    ):
        net[str(rid)] += cost
        if not estimated:  # a commit's usage (or a release's refund of an estimate)
            reported[str(rid)].append((tokens_in, tokens_out))
    states = {str(r): s for r, s in Reservation.objects.values_list("id", "state")}
    for e in entries:
        if e["op"] == "commit":
            usage = reported.get(e["id"], [])
            cost = net.get(e["id"], ZERO)
            if usage != [(e["in"], e["out"])] or cost != (e["in"] + e["out"]) * rate:
                problems.append(f"commit {e['id']} ({e['in']}, {e['out']}): {usage}, {cost}")
        elif e["op"] == "release":
            final, cost = states.get(e["id"]), net.get(e["id"], ZERO)
            if final != e["state"] or (final == "released" and cost != 0):
                problems.append(f"release {e['id']}: answered {e['state']}, now {final}, {cost}")
    staff = [e for e in entries if e["op"] == "staff"]
    audited = dict(
        AuditEvent.objects.filter(reason__startswith="soak ")
        .values("reason")
        .annotate(n=Count("id"))
        .values_list("reason", "n")
    )
    for e in staff:
        n = audited.get(e["reason"], 0)
        if n > 1 or (e["ack"] and e["writes"] and n != 1):
            problems.append(f"staff {e['reason']} (answered: {e['ack']}): {n} audit events")
    return problems
