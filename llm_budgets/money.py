"""Exact money: the stored precision and the two rounding rules, stated once.

Amounts are ``Decimal`` end to end. Holds round **up** to the stored precision (a hold never
under-reserves); charges round **half-even** to it.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

from django.utils.html import format_html
from django.utils.safestring import SafeString

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


# The one format people read money in (admin, emails, messages): the currency's usual number
# of places, thousands separators, the currency code. The exact stored value goes on hover or in
# the detail view (``exact``). Currencies not listed show two places.
CURRENCY_PLACES: dict[str, int] = {
    "BHD": 3,
    "CLP": 0,
    "ISK": 0,
    "JOD": 3,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
    "OMR": 3,
    "TND": 3,
    "VND": 0,
}
# Rates (prices per million tokens, per call) show every digit they have up to this many places.
RATE_DISPLAY_PLACES = 8


def currency_places(currency: str) -> int:
    """Places a currency is normally shown with: 2 for USD and EUR, 0 for JPY."""
    return CURRENCY_PLACES.get(currency.upper(), 2)


def _grouped(amount: Decimal, places: int) -> str:
    return f"{amount:,.{places}f}"


def money(amount: Decimal, currency: str) -> str:
    """An amount as people read it: ``9,998.65 USD``, rounded half-even to the currency's places.
    A non-zero amount too small to show says so (``< 0.01 USD``) instead of ``0.00``."""
    places = currency_places(currency)
    shown = amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    if shown == 0 and amount != 0:
        smallest = _grouped(Decimal(1).scaleb(-places), places)
        return f"{'> -' if amount < 0 else '< '}{smallest} {currency}".strip()
    return f"{_grouped(shown, places)} {currency}".strip()


def rate(amount: Decimal, currency: str, unit: str = "1M tokens") -> str:
    """A per-unit price with its unit: ``0.80 USD / 1M tokens``, ``0.0375 USD / 1M tokens``.
    At least the currency's places, more where the rate has them (up to
    ``RATE_DISPLAY_PLACES``; the exact value is ``exact``)."""
    places = currency_places(currency)
    digits = -min(0, amount.normalize().as_tuple().exponent)  # type: ignore[operator]
    places = max(places, min(int(digits), RATE_DISPLAY_PLACES))
    shown = amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    text = f"{_grouped(shown, places)} {currency}".strip()
    return f"{text} / {unit}" if unit else text


def exact(amount: Decimal, currency: str = "") -> str:
    """The stored value, every significant digit and no trailing zeros: ``9998.65294 USD``."""
    return f"{display(amount)} {currency}".strip()


def money_html(amount: Decimal | None, currency: str) -> SafeString | str:
    """``money`` for HTML pages, the exact stored value on hover; ``-`` for no amount."""
    if amount is None:
        return "-"
    return format_html(
        '<span class="llmb-money" style="white-space: nowrap" title="exact: {}">{}</span>',
        exact(amount, currency),
        money(amount, currency),
    )


def rate_html(amount: Decimal | None, currency: str, unit: str = "1M tokens") -> SafeString | str:
    """``rate`` for HTML pages, the exact stored rate on hover; ``-`` for no rate."""
    if amount is None:
        return "-"
    return format_html(
        '<span class="llmb-money" style="white-space: nowrap" title="exact: {}">{}</span>',
        exact(amount, currency),
        rate(amount, currency, unit),
    )


def money_field(amount: Decimal) -> str:
    """Money in an event body or another wire format: the exact decimal as a string (never a
    float)."""
    return format(amount, "f")
