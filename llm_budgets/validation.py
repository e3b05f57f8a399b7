"""Argument checks shared by the services. Each failure names the field and what to do."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage


def token_count(field: str, value: object, *, allow_zero: bool = True) -> int:
    """A whole, non-negative (or positive) token count below the configured maximum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidUsage(
            f"{field} must be a whole number of tokens, got {type(value).__name__} {value!r}.",
            field=field,
        )
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "at least 1"
        raise InvalidUsage(f"{field} must be {bound}, got {value}.", field=field)
    maximum = conf.MAX_TOKENS_PER_CALL
    if value > maximum:
        raise InvalidUsage(
            f"{field}={value} is more than the {maximum} tokens one call may use "
            "(LLM_BUDGETS['MAX_TOKENS_PER_CALL']).",
            field=field,
        )
    return value


def optional_money(field: str, value: object) -> Decimal | None:
    """``money``, or None when no value is given."""
    return None if value is None else money(field, value)


def money(field: str, value: object) -> Decimal:
    """A finite, non-negative Decimal amount. Floats are refused: money is never binary."""
    if value is None:
        raise InvalidUsage(f"{field} is required.", field=field)
    if isinstance(value, float):
        raise InvalidUsage(
            f"{field} must be a Decimal, int or numeric string, not a float ({value!r}): "
            f'write Decimal("{value}") to keep money exact.',
            field=field,
        )
    if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
        raise InvalidUsage(
            f"{field} must be a Decimal amount, got {type(value).__name__}.", field=field
        )
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidUsage(f"{field} must be a number, got {value!r}.", field=field) from None
    if not amount.is_finite():
        raise InvalidUsage(f"{field} must be finite, got {value!r}.", field=field)
    if amount < 0:
        raise InvalidUsage(f"{field} must be zero or more, got {amount}.", field=field)
    if amount >= Decimal(10) ** 13:
        raise InvalidUsage(f"{field}={amount} is absurdly large.", field=field)
    return amount


def identifier(field: str, value: object, *, max_length: int = 255) -> str:
    """A non-empty string id (tenant, end user, provider, model, idempotency key)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidUsage(f"{field} must be a non-empty string, got {value!r}.", field=field)
    if len(value) > max_length:
        raise InvalidUsage(f"{field} must be at most {max_length} characters.", field=field)
    if not storable(value):
        # PostgreSQL text cannot hold NUL, and a lone surrogate is not valid UTF-8: refuse here
        # rather than fail in the database as if the ledger were down.
        raise InvalidUsage(
            f"{field} must not contain NUL characters or unpaired surrogates.", field=field
        )
    return value


def storable(text: str) -> bool:
    """Whether every database can store ``text``: no NUL, valid UTF-8."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ttl_seconds(field: str, value: object) -> int:
    """A hold lifetime in whole seconds, from 1 to ``MAX_TTL_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidUsage(
            f"{field} must be a whole number of seconds, got {type(value).__name__} {value!r}.",
            field=field,
        )
    if not 1 <= value <= conf.MAX_TTL_SECONDS:
        raise InvalidUsage(
            f"{field} must be from 1 to {conf.MAX_TTL_SECONDS} seconds, got {value}.", field=field
        )
    return value
