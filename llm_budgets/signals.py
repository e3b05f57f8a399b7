"""Signals the app sends. Each is sent after the transaction that caused it commits
(``transaction.on_commit``), so a receiver never sees a change that was rolled back.

- ``kill_switch_tripped(sender=KillSwitch, switch=KillSwitch)``: a switch was tripped, by a person
  (``switch.tripped_by``) or by an anomaly detector (``switch.automatic``, ``switch.detector``).
- ``kill_switch_cleared(sender=KillSwitch, switch=KillSwitch)``: a person cleared it
  (``switch.cleared_by``, ``switch.clear_reason``).
"""

from __future__ import annotations

from django.dispatch import Signal

kill_switch_tripped = Signal()
kill_switch_cleared = Signal()
