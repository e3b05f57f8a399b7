"""System checks for ``settings.LLM_BUDGETS`` and for the database's ability to lock rows."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import connections

from llm_budgets.conf import (
    DEFAULTS,
    EXPIRED_HOLD_POLICIES,
    UNCERTAIN_SETTLE_RULES,
    WARNING_DELIVERIES,
)
from llm_budgets.models.fields import validate_thresholds


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    user = getattr(settings, "LLM_BUDGETS", {})
    if not isinstance(user, dict):
        return [
            Error(
                "LLM_BUDGETS must be a dict.",
                hint=f"Got {type(user).__name__}; see docs/settings.md.",
                id="llm_budgets.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Error(
                f"LLM_BUDGETS has an unknown key {key!r}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="llm_budgets.E002",
            )
        )
    values = {**DEFAULTS, **user}
    if not _is_positive_int(values["DEFAULT_TTL_SECONDS"]):
        errors.append(
            Error(
                "LLM_BUDGETS['DEFAULT_TTL_SECONDS'] must be a positive integer (seconds).",
                hint=f"Got {values['DEFAULT_TTL_SECONDS']!r}.",
                id="llm_budgets.E003",
            )
        )
    lock_timeout = values["LOCK_TIMEOUT_SECONDS"]
    if (
        isinstance(lock_timeout, bool)
        or not isinstance(lock_timeout, int | float | Decimal)
        or not 0 < lock_timeout <= 60
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['LOCK_TIMEOUT_SECONDS'] must be a number of seconds in (0, 60].",
                hint=f"Got {lock_timeout!r}. Admission waits at most this long for a counter lock.",
                id="llm_budgets.E004",
            )
        )
    if values["EXPIRED_HOLD_POLICY"] not in EXPIRED_HOLD_POLICIES:
        errors.append(
            Error(
                "LLM_BUDGETS['EXPIRED_HOLD_POLICY'] must be 'charge' or 'release'.",
                hint=f"Got {values['EXPIRED_HOLD_POLICY']!r}.",
                id="llm_budgets.E005",
            )
        )
    currency = values["CURRENCY"]
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        errors.append(
            Error(
                "LLM_BUDGETS['CURRENCY'] must be an ISO 4217 code such as 'USD'.",
                hint=f"Got {currency!r}.",
                id="llm_budgets.E006",
            )
        )
    if not _is_positive_int(values["MAX_TOKENS_PER_CALL"]):
        errors.append(
            Error(
                "LLM_BUDGETS['MAX_TOKENS_PER_CALL'] must be a positive integer.",
                hint=f"Got {values['MAX_TOKENS_PER_CALL']!r}.",
                id="llm_budgets.E007",
            )
        )
    max_ttl = values["MAX_TTL_SECONDS"]
    if not _is_positive_int(max_ttl) or (
        _is_positive_int(values["DEFAULT_TTL_SECONDS"]) and max_ttl < values["DEFAULT_TTL_SECONDS"]
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['MAX_TTL_SECONDS'] must be a positive integer "
                "no smaller than DEFAULT_TTL_SECONDS.",
                hint=f"Got {max_ttl!r}.",
                id="llm_budgets.E008",
            )
        )
    emails = values["OPERATOR_EMAILS"]
    if not isinstance(emails, list | tuple) or not all(
        isinstance(e, str) and "@" in e for e in emails
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['OPERATOR_EMAILS'] must be a list of email addresses.",
                hint=f"Got {emails!r}. They are emailed when a kill switch trips or clears.",
                id="llm_budgets.E040",
            )
        )
    errors.extend(_check_safety_margin(values["TOKEN_ESTIMATE_SAFETY_MARGIN"]))
    rate = values["API_THROTTLE_RATE"]
    if rate is not None and not (
        isinstance(rate, str) and re.fullmatch(r"[1-9][0-9]*/(s|m|h|d)[a-z]*", rate)
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['API_THROTTLE_RATE'] must be None or a rate such as '600/minute'.",
                hint=f"Got {rate!r}. Units: second, minute, hour, day.",
                id="llm_budgets.E009",
            )
        )
    rate = values["API_AUTH_FAILURE_RATE"]
    if rate is not None and not (
        isinstance(rate, str) and re.fullmatch(r"[1-9][0-9]*/(s|m|h|d)[a-z]*", rate)
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['API_AUTH_FAILURE_RATE'] must be None or a rate such as '20/minute'.",
                hint=f"Got {rate!r}. Units: second, minute, hour, day.",
                id="llm_budgets.E090",
            )
        )
    errors.extend(_check_job_settings(values))
    return errors


def _is_valid(validator: Any, value: Any) -> bool:
    try:
        validator(value)
    except ValidationError:
        return False
    return True


def _check_job_settings(values: dict[str, Any]) -> list[CheckMessage]:
    """Settings of the jobs and warning emails (docs/operations.md)."""
    errors: list[CheckMessage] = []
    choices = (
        ("UNCERTAIN_SETTLE_RULE", UNCERTAIN_SETTLE_RULES, "llm_budgets.E020"),
        ("WARNING_DELIVERY", WARNING_DELIVERIES, "llm_budgets.E023"),
    )
    for key, allowed, error_id in choices:
        if values[key] not in allowed:
            errors.append(
                Error(
                    f"LLM_BUDGETS[{key!r}] must be one of {', '.join(map(repr, allowed))}.",
                    hint=f"Got {values[key]!r}.",
                    id=error_id,
                )
            )
    positive = (
        ("UNCERTAIN_MAX_AGE_SECONDS", "llm_budgets.E021"),
        ("WARNING_CLAIM_TIMEOUT_SECONDS", "llm_budgets.E024"),
        ("RETENTION_RELEASED_DAYS", "llm_budgets.E026"),
        ("ROLLUP_LOOKBACK_DAYS", "llm_budgets.E027"),
        ("RETENTION_REFUSALS_DAYS", "llm_budgets.E028"),
    )
    for key, error_id in positive:
        if not _is_positive_int(values[key]):
            errors.append(
                Error(
                    f"LLM_BUDGETS[{key!r}] must be a positive integer.",
                    hint=f"Got {values[key]!r}.",
                    id=error_id,
                )
            )
    thresholds = values["WARNING_THRESHOLDS"]
    if thresholds is None or not _is_valid(validate_thresholds, thresholds):
        errors.append(
            Error(
                "LLM_BUDGETS['WARNING_THRESHOLDS'] must be a list of distinct whole "
                "percentages from 1 to 100 ([] for no warnings).",
                hint=f"Got {thresholds!r}; e.g. [50, 80, 100].",
                id="llm_budgets.E022",
            )
        )
    sender = values["WARNING_FROM_EMAIL"]
    if sender is not None and not (
        isinstance(sender, str) and _is_valid(validate_email, sender.rpartition("<")[2].rstrip(">"))
    ):
        errors.append(
            Error(
                "LLM_BUDGETS['WARNING_FROM_EMAIL'] must be None or an email address.",
                hint=f"Got {sender!r}; None sends from settings.DEFAULT_FROM_EMAIL.",
                id="llm_budgets.E025",
            )
        )
    return errors


def _check_safety_margin(value: Any) -> list[CheckMessage]:
    try:
        margin = None if isinstance(value, bool | float) else Decimal(str(value))
    except ArithmeticError:
        margin = None
    if margin is not None and margin.is_finite() and 1 <= margin <= 10:
        return []
    return [
        Error(
            "LLM_BUDGETS['TOKEN_ESTIMATE_SAFETY_MARGIN'] must be a number from 1 to 10 "
            "(a Decimal, int or numeric string).",
            hint=f"Got {value!r}. It multiplies the conservative token bound; see docs/pricing.md.",
            id="llm_budgets.E030",
        )
    ]


@register(Tags.database)
def check_row_locking(**kwargs: Any) -> list[CheckMessage]:
    """Warn when admission cannot be serialised: no row locks and no write lock at BEGIN."""
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        connection = connections[alias]
        if connection.features.has_select_for_update:
            continue
        mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if connection.vendor == "sqlite" and str(mode).upper() == "IMMEDIATE":
            continue
        messages.append(
            Warning(
                f"Database {alias!r} ({connection.vendor}) cannot lock rows, so concurrent "
                "admissions may overspend a budget.",
                hint=(
                    "Use PostgreSQL in production. On SQLite set "
                    "OPTIONS={'transaction_mode': 'IMMEDIATE', 'timeout': 5}."
                ),
                id="llm_budgets.W001",
            )
        )
    return messages
