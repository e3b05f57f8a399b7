"""The app's signals. Each is sent after the transaction that caused it commits, so a receiver
never sees an event that was rolled back. Receivers must not raise: they run in a job, and a
failing receiver is logged, not retried (``send_robust``).
"""

from __future__ import annotations

from django.dispatch import Signal

threshold_crossed = Signal()
"""A budget's spent + reserved reached one of its warning thresholds in the current period.

Sent once per (budget, period, threshold), by the warning scan, with ``sender`` the
``ThresholdCrossing`` class and these keyword arguments:

- ``crossing``: the ``ThresholdCrossing`` row (its ``state`` says whether an email will follow)
- ``budget``: the ``Budget``
- ``threshold``: the percentage reached (int)
- ``period_start``: the period's start (aware datetime)
- ``spent``, ``reserved``, ``limit``: ``Decimal`` amounts at detection, in ``currency`` (str)
"""
