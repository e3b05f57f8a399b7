"""Money and time in templates, in the one format (``llm_budgets.money``, ``llm_budgets.clock``).

``{% load llm_budgets_money %}``, then ``{{ amount|money:currency }}`` (``9,998.65 USD``, exact
value on hover), ``{{ rate|rate:currency }}`` (``0.80 USD / 1M tokens``),
``{{ amount|money_plain:currency }}``
(no HTML, for emails) and ``{{ at|when:tenant.timezone }}`` (``Tue 1 Dec 2026 12:10 CET``).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django import template
from django.utils.safestring import SafeString

from llm_budgets import clock
from llm_budgets import money as money_format

register = template.Library()


@register.filter
def money(amount: Decimal | None, currency: str = "") -> SafeString | str:
    return money_format.money_html(amount, currency)


@register.filter
def money_plain(amount: Decimal | None, currency: str = "") -> str:
    return "-" if amount is None else money_format.money(amount, currency)


@register.filter
def rate(amount: Decimal | None, currency: str = "") -> SafeString | str:
    return money_format.rate_html(amount, currency)


@register.filter
def when(at: datetime | None, tz_name: str | None = None) -> str:
    return clock.when(at, tz_name)
