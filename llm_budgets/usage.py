"""Usage as the public API counts it, and the one place a provider's own shape is translated.

The convention (OpenAI's, also genai-prices'): ``input_tokens`` counts **all** input tokens,
cached ones included; ``cached_input_tokens`` (cache reads) and ``cache_write_tokens`` say how many
of those were read from or written to the cache, and ``cache_write_1h_tokens`` how many of the
writes used the 1-hour cache. ``output_tokens`` includes ``reasoning_tokens``. ``tool_calls``
counts calls of named server-side tools (``{"web_search": 2}``).

Anthropic reports ``input_tokens`` *excluding* cache reads and writes: :func:`from_anthropic`
adds them back. Nothing else in the app knows about provider shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage, UsageExceedsHold


def _plain(value: object) -> object:
    """A column's value: a mapping (``tool_calls``) as a plain dict, JSON-ready."""
    return dict(value) if isinstance(value, Mapping) else value


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0
    tool_calls: Mapping[str, int] = field(default_factory=dict)

    def as_fields(self) -> dict[str, Any]:
        """The ledger line's usage columns: one per field, named alike (a new field is a new
        column of ``UsageRecord``, of the export and of the REST body, with nothing else to
        edit)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def usage_keywords(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The usage among a commit's arguments (its ``locals()`` on entry), one keyword per field of
    :class:`Usage`, in its order: each commit (``budgets.commit``, ``Hold.commit``, the client's,
    ``settlement.reservation_commit``) takes them all, so they are named here alone. A field a
    commit does not take is a ``KeyError``."""
    return {f.name: arguments[f.name] for f in fields(Usage)}


def usage_validate(
    *,
    input_tokens: object,
    output_tokens: object,
    cached_input_tokens: object = 0,
    cache_write_tokens: object = 0,
    cache_write_1h_tokens: object = 0,
    reasoning_tokens: object = 0,
    tool_calls: object = None,
) -> Usage:
    """Check each count and that the parts fit in their totals; ``InvalidUsage`` names the field."""
    counts = {
        name: validation.token_count(name, value)
        for name, value in (
            ("input_tokens", input_tokens),
            ("output_tokens", output_tokens),
            ("cached_input_tokens", cached_input_tokens),
            ("cache_write_tokens", cache_write_tokens),
            ("cache_write_1h_tokens", cache_write_1h_tokens),
            ("reasoning_tokens", reasoning_tokens),
        )
    }
    if counts["cached_input_tokens"] + counts["cache_write_tokens"] > counts["input_tokens"]:
        raise InvalidUsage(
            f"cached_input_tokens ({counts['cached_input_tokens']}) plus cache_write_tokens "
            f"({counts['cache_write_tokens']}) cannot exceed input_tokens "
            f"({counts['input_tokens']}): input_tokens counts cache reads and writes too "
            "(for Anthropic usage, use llm_budgets.usage.from_anthropic).",
            field="cached_input_tokens",
        )
    if counts["cache_write_1h_tokens"] > counts["cache_write_tokens"]:
        raise InvalidUsage(
            f"cache_write_1h_tokens ({counts['cache_write_1h_tokens']}) cannot exceed "
            f"cache_write_tokens ({counts['cache_write_tokens']}): it counts the 1-hour part.",
            field="cache_write_1h_tokens",
        )
    if counts["reasoning_tokens"] > counts["output_tokens"]:
        raise InvalidUsage(
            f"reasoning_tokens ({counts['reasoning_tokens']}) cannot exceed output_tokens "
            f"({counts['output_tokens']}): output_tokens includes reasoning.",
            field="reasoning_tokens",
        )
    return Usage(**counts, tool_calls=tool_calls_validate(tool_calls))


# The plausibility rule's tolerance on input (docs/limits.md, "Usage a hold admits"): a hold's
# input count is an estimate (a count of the messages, or the caller's own), and a provider's
# count adds what a client cannot see (tool definitions, its own framing). Reported input may
# exceed the held count by this percentage plus this many tokens.
INPUT_TOLERANCE_PERCENT = 10
INPUT_TOLERANCE_TOKENS = 256


def input_allowed(held_input_tokens: int) -> int:
    """The most input a commit may report on a hold that counted ``held_input_tokens``."""
    tolerance = held_input_tokens * INPUT_TOLERANCE_PERCENT // 100 + INPUT_TOLERANCE_TOKENS
    return held_input_tokens + tolerance


def usage_within_hold(
    usage: Usage,
    *,
    reservation_id: object,
    input_tokens: int,
    max_output_tokens: int,
    max_tool_calls: Mapping[str, int] | None,
) -> None:
    """The one plausibility rule for a commit: usage its hold could have produced. Output at
    most the ceiling the call was sent with; input at most the held count plus the tolerance
    (:func:`input_allowed`); each server-side tool's calls at most those held (not checked for
    a hold that recorded none, ``None``: taken before they were recorded); cache reads and writes
    within input and reasoning within output (:func:`usage_validate`). Raises
    ``UsageExceedsHold`` naming the first field beyond it."""
    checks = [
        ("output_tokens", usage.output_tokens, max_output_tokens, "the output ceiling it held"),
        (
            "input_tokens",
            usage.input_tokens,
            input_allowed(input_tokens),
            f"the {input_tokens} input tokens it held plus {INPUT_TOLERANCE_PERCENT}% and "
            f"{INPUT_TOLERANCE_TOKENS} tokens",
        ),
    ]
    checks.append(
        (
            "cached_input_tokens",
            usage.cached_input_tokens + usage.cache_write_tokens,
            usage.input_tokens,
            "its input: cache reads and writes are part of it",
        )
    )
    if max_tool_calls is not None:
        checks += [
            (f"tool_calls[{tool!r}]", calls, max_tool_calls.get(tool, 0), "the calls it held")
            for tool, calls in sorted(usage.tool_calls.items())
        ]
    for name, reported, allowed, what in checks:
        if reported > allowed:
            raise UsageExceedsHold(
                f"{name} {reported} is more than reservation {reservation_id} admits "
                f"({allowed}: {what}), so the call could not have used it. Nothing was recorded "
                "and the hold is still open: commit the usage the provider reported for this "
                "call. To hold more, reserve with a higher max_output_tokens, input_tokens or "
                "max_tool_calls.",
                field=name,
                reservation_id=str(reservation_id),
                reported=reported,
                allowed=allowed,
            )


def tool_calls_validate(value: object, *, field: str = "tool_calls") -> dict[str, int]:
    """``{"tool name": calls}``; ``InvalidUsage`` names ``field``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidUsage(
            f'{field} must map tool names to call counts, e.g. {{"web_search": 2}}, '
            f"got {type(value).__name__}.",
            field=field,
        )
    calls = {}
    for name, count in value.items():
        calls[validation.identifier(field, name, max_length=64)] = validation.token_count(
            f"{field}[{name!r}]", count
        )
    return {name: count for name, count in calls.items() if count}


def _get(obj: object, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _int(obj: object, key: str) -> int:
    value = _get(obj, key)
    return 0 if value is None else value


def from_anthropic(usage: object) -> Usage:
    """Translate Anthropic's ``usage`` (a dict or the SDK object), where ``input_tokens``
    excludes ``cache_read_input_tokens`` and ``cache_creation_input_tokens``."""
    uncached = _int(usage, "input_tokens")
    reads = _int(usage, "cache_read_input_tokens")
    writes = _int(usage, "cache_creation_input_tokens")
    writes_1h = _int(_get(usage, "cache_creation"), "ephemeral_1h_input_tokens")
    server_tools = _get(usage, "server_tool_use")
    tools = {
        "web_search": _int(server_tools, "web_search_requests"),
        "web_fetch": _int(server_tools, "web_fetch_requests"),
    }
    return usage_validate(
        input_tokens=uncached + reads + writes,
        output_tokens=_int(usage, "output_tokens"),
        cached_input_tokens=reads,
        cache_write_tokens=writes,
        cache_write_1h_tokens=writes_1h,
        tool_calls=tools,
    )


def from_openai(usage: object) -> Usage:
    """Translate OpenAI's ``usage`` (Chat Completions or Responses API, dict or SDK object),
    where input counts cache reads (``cached_tokens``) and, where reported, cache writes
    (``cache_write_tokens``; its 30-minute/12-hour split is priced at the one cache-write rate)."""
    responses_api = _get(usage, "input_tokens") is not None
    if responses_api:
        input_tokens = _int(usage, "input_tokens")
        output_tokens = _int(usage, "output_tokens")
        input_details = _get(usage, "input_tokens_details")
        output_details = _get(usage, "output_tokens_details")
    else:
        input_tokens = _int(usage, "prompt_tokens")
        output_tokens = _int(usage, "completion_tokens")
        input_details = _get(usage, "prompt_tokens_details")
        output_details = _get(usage, "completion_tokens_details")
    return usage_validate(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=_int(input_details, "cached_tokens"),
        cache_write_tokens=_int(input_details, "cache_write_tokens"),
        reasoning_tokens=_int(output_details, "reasoning_tokens"),
    )
