"""``{% load llm_budgets_money %}``: ``{{ amount|money:currency }}``, the app's one money format
(``llm_budgets.money``)."""

from __future__ import annotations

from decimal import Decimal

from django import template

from llm_budgets.money import display

register = template.Library()


def money_text(amount: Decimal | None, currency: str = "") -> str:
    """An amount as money (``12.50 USD``); empty for None."""
    if amount is None:
        return ""
    text = display(Decimal(amount))
    return f"{text} {currency}" if currency else text


@register.filter(name="money")
def money(amount: Decimal | None, currency: str = "") -> str:
    return money_text(amount, currency)
