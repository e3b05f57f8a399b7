"""Tags on a reservation: a few caller-chosen ``{"key": "value"}`` strings (feature, job, trace
id) copied onto its ledger lines, so spend can be broken down without a join. Bounded, so a
caller cannot turn the ledger into a blob store."""

from __future__ import annotations

from collections.abc import Mapping

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage

MAX_TAGS = 16
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 256


def tags_validate(value: object, *, field: str = "tags") -> dict[str, str]:
    """``{"key": "value"}`` with at most :data:`MAX_TAGS` string pairs; ``InvalidUsage`` names
    the field (``tags[key]`` for a bad value)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidUsage(
            f'{field} must map names to strings, e.g. {{"feature": "chat"}}, '
            f"got {type(value).__name__}.",
            field=field,
        )
    if len(value) > MAX_TAGS:
        raise InvalidUsage(f"{field} can have at most {MAX_TAGS} entries.", field=field)
    tags = {}
    for key, text in value.items():
        name = f"{field}[{key!r}]"
        key = validation.identifier(field, key, max_length=MAX_KEY_LENGTH)
        if key in tags:
            raise InvalidUsage(
                f"{name} is the same tag name as another one once normalised ({key!r}); "
                "send each name once.",
                field=field,
            )
        if not isinstance(text, str):
            raise InvalidUsage(f"{name} must be a string, got {text!r}.", field=field)
        if len(text) > MAX_VALUE_LENGTH:
            raise InvalidUsage(
                f"{name} must be at most {MAX_VALUE_LENGTH} characters.", field=field
            )
        if not validation.storable(text):
            raise InvalidUsage(
                f"{name} must not contain NUL characters or unpaired surrogates.", field=field
            )
        tags[key] = text
    return tags
