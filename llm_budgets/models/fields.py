"""Validators shared by the models."""

from __future__ import annotations

import zoneinfo

from django.core.exceptions import ValidationError


def validate_timezone(value: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(
            f"{value!r} is not an IANA time zone such as 'Europe/Amsterdam'."
        ) from exc
