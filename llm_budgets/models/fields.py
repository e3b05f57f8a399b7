"""Validators shared by the models."""

from __future__ import annotations

import re
import zoneinfo
from typing import Any

from django.core.exceptions import ValidationError

from llm_budgets.conf import email_address_valid


def validate_timezone(value: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(
            f"{value!r} is not an IANA time zone such as 'Europe/Amsterdam'."
        ) from exc


def split_emails(value: str) -> list[str]:
    """Addresses separated by commas, semicolons or new lines; blanks dropped."""
    return [part.strip() for part in re.split(r"[,;\n]", value or "") if part.strip()]


def validate_email_list(value: str) -> None:
    """Addresses as ``split_emails`` reads them, each tested as every email setting is
    (``llm_budgets.conf.email_address_valid``)."""
    for address in split_emails(value):
        if not email_address_valid(address):
            raise ValidationError(
                f"Enter a valid email address ({address!r} is not one).", code="invalid"
            )


def validate_thresholds(value: Any) -> None:
    """Warning thresholds: a list of distinct whole percentages from 1 to 100."""
    if value is None:
        return
    if (
        not isinstance(value, list)
        or not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 100 for p in value)
        or len(set(value)) != len(value)
    ):
        raise ValidationError(
            f"Warning thresholds must be a list of distinct whole percentages from 1 to 100, "
            f"e.g. [50, 80, 100]; got {value!r}."
        )
