"""Field helpers shared by the models: money columns and time zone validation."""

from __future__ import annotations

import zoneinfo

from django.core.exceptions import ValidationError
from django.db import models

from llm_budgets.money import DECIMAL_PLACES, MAX_DIGITS, RATE_DECIMAL_PLACES, RATE_MAX_DIGITS


def money_field(**kwargs: object) -> models.DecimalField:
    """A money column at the stored precision (see ``llm_budgets.money``)."""
    return models.DecimalField(max_digits=MAX_DIGITS, decimal_places=DECIMAL_PLACES, **kwargs)  # type: ignore[arg-type]


def rate_field(**kwargs: object) -> models.DecimalField:
    """A price rate column: finer than money, so catalogue rates are stored as stated."""
    return models.DecimalField(
        max_digits=RATE_MAX_DIGITS,
        decimal_places=RATE_DECIMAL_PLACES,
        **kwargs,  # type: ignore[arg-type]
    )


def validate_timezone(value: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(
            f"{value!r} is not an IANA time zone such as 'Europe/Amsterdam'."
        ) from exc
