"""Signals the app sends. Each is sent after the transaction that caused it commits
(``transaction.on_commit``), so a receiver never sees a change that was rolled back.

- ``kill_switch_tripped(sender=KillSwitch, switch=KillSwitch)``: a switch was tripped, by a person
  (``switch.tripped_by``) or by an anomaly detector (``switch.automatic``, ``switch.detector``).
- ``kill_switch_cleared(sender=KillSwitch, switch=KillSwitch)``: a person cleared it
  (``switch.cleared_by``, ``switch.clear_reason``).
- ``threshold_crossed(sender=ThresholdCrossing, ...)``: a budget reached a warning threshold;
  its arguments are documented below.

Receivers must not raise: the senders run in jobs, and a failing receiver is logged, not retried
(``send_robust``) where noted.
"""

from __future__ import annotations

from django.dispatch import Signal

kill_switch_tripped = Signal()
kill_switch_cleared = Signal()

threshold_crossed = Signal()
"""A budget's spent + reserved reached one of its warning thresholds in the current period.

Sent once per (budget, period, threshold), by the warning scan, with ``sender`` the
``ThresholdCrossing`` class and these keyword arguments:

- ``crossing``: the ``ThresholdCrossing`` row (its ``state`` says whether an email will follow)
- ``budget``: the ``Budget``
- ``end_user``: for an each-end-user budget, whose usage crossed it (else None)
- ``threshold``: the percentage reached (int)
- ``period_start``: the period's start (aware datetime)
- ``spent``, ``reserved``, ``limit``: ``Decimal`` amounts at detection, in ``currency`` (str)
- ``kind``: ``"threshold"``, or ``"projected"`` for a plan's opt-in warning that the budget is
  projected to reach its limit before it resets (``threshold`` is then 100, and the crossing
  carries ``projected`` and ``runs_out_at``)
"""

reservation_settled = Signal()
"""A hold was committed (the call's cost charged, a late commit or an uncertain hold's included)
or released. Sent when the *ledger's* transaction commits, on the ledger's own connection: a
host's rollback of the transaction the call ran in does not stop it (docs/operations.md, "The
ledger's own connection"). ``sender`` is the ``Reservation`` class, with:

- ``reservation_id``: the hold's id (UUID)
- ``tenant_id``: the tenant's primary key (int)
- ``state``: ``"committed"`` or ``"released"``
- ``cost``: the provider cost this settlement charged (``Decimal``; 0 for a release), in
  ``currency`` (str)
"""

stripe_reconciled = Signal()
"""A Stripe reconciliation run finished (``llm_budgets.billing.reconciliation``). Sent after
commit with ``sender`` the ``ReconciliationRun`` class and:

- ``run``: the ``ReconciliationRun`` (``run.is_clean``: no difference and no error; ``run.error``)
- ``differences``: list of ``ReconciliationDifference`` (customer, hour, delivered vs Stripe units)
"""
