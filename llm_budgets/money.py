"""Exact money: the stored precision and the two rounding rules, stated once.

Amounts are ``Decimal`` end to end. Holds round **up** to the stored precision (a hold never
under-reserves); charges round **half-even** to it.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

# Digits after the point of every stored amount. A cheap model's single token costs
# around 1e-8 USD, so 10 places keeps per-token prices exact.
DECIMAL_PLACES = 10
MAX_DIGITS = 24
QUANTUM = Decimal(1).scaleb(-DECIMAL_PLACES)
# Price rates (per million tokens, per call) are stored finer than amounts: catalogues state
# rates such as 0.041666666666666664 per million tokens.
RATE_DECIMAL_PLACES = 18
RATE_MAX_DIGITS = 32
RATE_QUANTUM = Decimal(1).scaleb(-RATE_DECIMAL_PLACES)
# SQLite keeps a decimal exactly only up to 15 significant digits (it stores REAL).
RATE_SIGNIFICANT_DIGITS = 15
ZERO = Decimal(0)
MILLION = Decimal(1_000_000)


def round_hold(amount: Decimal) -> Decimal:
    """Round a worst-case amount up to the stored precision."""
    return amount.quantize(QUANTUM, rounding=ROUND_CEILING)


def round_charge(amount: Decimal) -> Decimal:
    """Round an actual cost half-even to the stored precision."""
    return amount.quantize(QUANTUM, rounding=ROUND_HALF_EVEN)


def display(amount: Decimal) -> str:
    """An amount for messages: no trailing zeros past the cents (``4.99405``, ``5.00``)."""
    text = format(amount.normalize(), "f")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"
