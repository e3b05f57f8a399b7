"""Argument checks shared by the services. Each failure names the field and what to do.

This is where outside input becomes a value, once, whichever door it came in by (Python API,
REST, admin). The policy for identifiers (tenant, end user, tag name, idempotency key, provider,
model) is in docs/reliability.md ("Identifiers"): Unicode NFKC, then a refusal of invisible,
control and bidirectional characters, of the replacement character (undecodable input) and of
leading or trailing white space; case is kept and significant.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.money import DECIMAL_PLACES

# Code points that render as nothing (or as nothing distinguishable) but are not in the Cc/Cf/Cs
# categories: Unicode's Default_Ignorable_Code_Point letters and marks, and the variation
# selectors. With Cc (controls), Cf (format: zero-width space and joiners, soft hyphen, BOM,
# bidirectional marks, embeddings and isolates), Cs (surrogates), Co (private use), Cn
# (unassigned), Zl/Zp (line and paragraph separators) and U+FFFD they are refused in identifiers.
_INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u3164\uffa0"
    + "".join(chr(c) for c in range(0xFE00, 0xFE10))
)
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_REPLACEMENT = "\ufffd"
# Plain decimal notation in ASCII digits: no sign, exponent, spaces, separators or other scripts'
# digits (Python's Decimal() and int() accept all of those).
_PLAIN_DECIMAL = re.compile(r"[0-9]{1,30}(\.[0-9]{1,30})?")
_PLAIN_INTEGER = re.compile(r"[0-9]{1,1000}")
# The run id that names every run: ``set_limit(run="*")`` only, never a call's run.
ALL_RUNS = "*"


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


def whole_number(field: str, value: object) -> int:
    """An integer from outside (a JSON body or a query string): an ``int``, or a string of ASCII
    digits only. Refused with a message naming ``field``: floats (``10.0``, ``1e3``), booleans,
    signs, spaces, ``_`` separators and other scripts' digits (Arabic-Indic ``10``), all of
    which Python's ``int()`` would quietly accept."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _PLAIN_INTEGER.fullmatch(value):
        return int(value)
    raise InvalidUsage(
        f"{field} must be a whole number written with the digits 0-9 (no sign, decimal point, "
        f"exponent, spaces or separators), got {value!r}.",
        field=field,
    )


def optional_money(field: str, value: object, *, places: int = DECIMAL_PLACES) -> Decimal | None:
    """``money``, or None when no value is given."""
    return None if value is None else money(field, value, places=places)


def money(field: str, value: object, *, places: int = DECIMAL_PLACES) -> Decimal:
    """A finite, non-negative Decimal amount with at most ``places`` decimals (more would be
    rounded away when stored: refused instead). Floats are refused: money is never binary.
    Strings must be plain decimal notation in ASCII digits (``"30"``, ``"0.25"``): no sign, so
    no negative zero, no exponent, no spaces."""
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
    if isinstance(value, str) and not _PLAIN_DECIMAL.fullmatch(value):
        raise InvalidUsage(
            f'{field} must be a plain decimal number such as "30" or "0.25" (digits 0-9, '
            f"at most one point; no sign, exponent or spaces), got {value!r}.",
            field=field,
        )
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidUsage(f"{field} must be a number, got {value!r}.", field=field) from None
    if not amount.is_finite():
        raise InvalidUsage(f"{field} must be finite, got {value!r}.", field=field)
    if amount < 0 or amount.is_signed():
        raise InvalidUsage(f"{field} must be zero or more, got {amount}.", field=field)
    if amount >= Decimal(10) ** 13:
        raise InvalidUsage(f"{field}={amount} is absurdly large.", field=field)
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        raise InvalidUsage(
            f"{field}={amount} has more than {places} decimal places; it would be rounded when "
            "stored. Round it yourself.",
            field=field,
        )
    return amount


def identifier(field: str, value: object, *, max_length: int = 255) -> str:
    """A non-empty string id (tenant, end user, tag name, provider, model, idempotency key), in
    its one canonical form: use the returned value, not the argument.

    NFKC-normalised, so composed and decomposed ``é`` and fullwidth ``u1`` (U+FF55 U+0031) are
    the id they look like; refused (naming the character) when it contains anything invisible:
    controls, format characters (zero-width space, soft hyphen, BOM, bidirectional marks),
    unassigned or private-use code points, U+FFFD (the input was not valid UTF-8), or white space
    at either end.
    Case is kept: ``U1`` and ``u1`` are two ids, as they are in most systems that issue them."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidUsage(f"{field} must be a non-empty string, got {value!r}.", field=field)
    if not storable(value):
        # PostgreSQL text cannot hold NUL, and a lone surrogate is not valid UTF-8: refuse here
        # rather than fail in the database as if the ledger were down.
        raise InvalidUsage(
            f"{field} must not contain NUL characters or unpaired surrogates.", field=field
        )
    text = unicodedata.normalize("NFKC", value)
    for position, char in enumerate(text):
        if (
            char in _INVISIBLE
            or char == _REPLACEMENT
            or (unicodedata.category(char) in _REFUSED_CATEGORIES)
        ):
            name = unicodedata.name(char, "unnamed")
            reason = (
                "the input was not valid UTF-8"
                if char == _REPLACEMENT
                else "ids must be visible text, so two ids that look alike are one id"
            )
            raise InvalidUsage(
                f"{field} contains U+{ord(char):04X} ({name}) at position {position}: {reason}. "
                "Remove it.",
                field=field,
            )
    if text != text.strip():
        raise InvalidUsage(
            f"{field} must not start or end with white space, got {value!r}.", field=field
        )
    if len(text) > max_length:
        raise InvalidUsage(f"{field} must be at most {max_length} characters.", field=field)
    return text


def storable(text: str) -> bool:
    """Whether every database can store ``text``: no NUL, valid UTF-8."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` opens more than ``limit`` nested arrays/objects (strings skipped), found
    without recursion."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def first_unstorable(value: Any) -> str | None:
    """The path of the first string (or key) no database can store, walking without recursion."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if not storable(item):
                return path or "body"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not storable(key):
                    return f"{path}.{key!r}" if path else repr(key)
                pending.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(item, list):
            pending.extend(
                (f"{path}.{index}" if path else str(index), child)
                for index, child in enumerate(item)
            )
    return None


def ttl_seconds(field: str, value: object) -> int:
    """A hold lifetime in whole seconds, from 1 to ``MAX_TTL_SECONDS``. Checked before any
    ``timedelta`` is built (a huge value would overflow it)."""
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


def run_id(field: str, value: object) -> str:
    """A run's id, as a call names it: an identifier, never ``"*"`` (which names every run in
    ``set_limit`` only)."""
    run = identifier(field, value)
    if run == ALL_RUNS:
        raise InvalidUsage(
            f'{field} "*" means every run and only sets a limit; a call names one run.',
            field=field,
        )
    return run
