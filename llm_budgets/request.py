"""What a call asks, once: :class:`Request`, beside :class:`llm_budgets.usage.Usage` (what it
used).

Every surface describes a would-be call with it: the Python API (``budgets.reserve``, ``quote``,
``explain``), the HTTP client (which sends :meth:`Request.wire`), the REST serializers (whose
validated data becomes one) and the services (admission, quotes, explanations), which check it
with :meth:`Request.checked`, the one validation: every error names the field and says what to
do, whichever door the call came in by.

Bottom layer: no ORM, no engine. Counting the tokens of ``messages`` / ``prompt`` needs a
tokenizer and is done by ``llm_budgets.pricing.estimates.input_token_count``;
:meth:`Request.checked` checks that exactly one kind of input was given.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.tags import tags_validate
from llm_budgets.usage import tool_calls_validate

__all__ = ["Request", "service_tier_validate"]


def service_tier_validate(value: object) -> str:
    """A service tier name (``""`` or None: the standard tier)."""
    if value is None or value == "":
        return ""
    return validation.identifier("service_tier", value, max_length=32)


def _ttl(value: object) -> int | timedelta | None:
    """A hold lifetime: seconds (int) or a timedelta, from 1 s to ``MAX_TTL_SECONDS``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        delta = value
    elif isinstance(value, int) and not isinstance(value, bool):
        # In range before the timedelta is built: a huge ttl would overflow it.
        return validation.ttl_seconds("ttl", value)
    else:
        raise InvalidUsage(f"ttl must be seconds (int) or a timedelta, got {value!r}.", field="ttl")
    if not timedelta(seconds=1) <= delta <= timedelta(seconds=conf.MAX_TTL_SECONDS):
        raise InvalidUsage(
            f"ttl must be from 1 to {conf.MAX_TTL_SECONDS} seconds, got {delta.total_seconds():g}.",
            field="ttl",
        )
    return delta


@dataclass(frozen=True, kw_only=True)
class Request:
    """A would-be call: who asks (``tenant``, ``end_user``, ``run``, ``tags``), what for
    (``provider``, ``model``, its input as ``input_tokens`` or ``messages`` or ``prompt``, the
    output ceiling ``max_output_tokens``, the tools' ``max_tool_calls``, the ``service_tier``),
    and how to hold it (``ttl`` in seconds, ``allow_degrade``, ``idempotency_key``).

    Built as given (no checks: the HTTP client builds one without Django settings); a service
    takes :meth:`checked`'s copy, or build a checked one at once with :meth:`of`."""

    tenant: str | None = None  # required in process; over HTTP a tenant key implies it
    model: str
    input_tokens: int | None = None
    max_output_tokens: int | None = None
    end_user: str | None = None
    provider: str | None = None
    idempotency_key: str | None = None
    ttl: int | timedelta | None = None  # seconds; None: DEFAULT_TTL_SECONDS
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    max_tool_calls: Mapping[str, int] | None = None
    allow_degrade: bool = False
    tags: Mapping[str, str] | None = None
    run: str | None = None
    service_tier: str | None = None  # the integrations' priority / flex tiers; None: standard
    # Set by checked() alone: a Request built by hand (or with _checked=...) is never trusted.
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, **fields: Any) -> Request:
        """A checked request from these fields (:meth:`checked`)."""
        return cls(**fields).checked()

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> Request:
        """The request a surface's own arguments describe, built as given: ``budgets.reserve``,
        ``quote`` and ``explain`` and the client's pass their ``locals()`` on entry (a method's
        ``self`` left out), each of their parameters a field of this class
        (tests/test_request.py), so the fields are named here alone. A name that is no field
        is a ``TypeError``, as a misspelt keyword is."""
        return cls(**{name: value for name, value in arguments.items() if name != "self"})

    def checked(self) -> Request:
        """This request with every field validated and in its canonical form (identifiers
        NFKC-normalised, ``tags`` and ``max_tool_calls`` as plain dicts, ``service_tier`` ``""``
        for the standard tier), or ``InvalidUsage`` naming the first bad field. The
        ``tenant`` is required here. ``messages`` and ``prompt`` are checked as they are
        counted (``llm_budgets.pricing.estimates.input_token_count``)."""
        if self._checked:
            return self
        if not isinstance(self.allow_degrade, bool):
            raise InvalidUsage("allow_degrade must be True or False.", field="allow_degrade")
        tags = tags_validate(self.tags)
        tier = service_tier_validate(self.service_tier)
        run = None if self.run is None else validation.run_id("run", self.run)
        ttl = _ttl(self.ttl)
        provider = (
            None
            if self.provider is None
            else validation.identifier("provider", self.provider, max_length=64)
        )
        model = validation.identifier("model", self.model, max_length=128)
        tenant = validation.identifier("tenant", self.tenant)
        end_user = (
            None if self.end_user is None else validation.identifier("end_user", self.end_user)
        )
        input_tokens = self.input_tokens
        if input_tokens is not None:
            if self.messages is not None or self.prompt is not None:
                raise InvalidUsage(
                    "give input_tokens, or messages / prompt to count, not both.",
                    field="input_tokens",
                )
            input_tokens = validation.token_count("input_tokens", input_tokens)
        elif self.messages is None and self.prompt is None:
            validation.token_count("input_tokens", None)  # raises, naming the field
        ceiling = (
            None
            if self.max_output_tokens is None
            else validation.token_count(
                "max_output_tokens", self.max_output_tokens, allow_zero=False
            )
        )
        key = (
            None
            if self.idempotency_key is None
            else validation.identifier("idempotency_key", self.idempotency_key)
        )
        tool_calls = tool_calls_validate(self.max_tool_calls, field="max_tool_calls")
        checked = dataclasses.replace(
            self,
            tenant=tenant,
            model=model,
            input_tokens=input_tokens,
            max_output_tokens=ceiling,
            end_user=end_user,
            provider=provider,
            idempotency_key=key,
            ttl=ttl,
            max_tool_calls=tool_calls,
            tags=tags,
            run=run,
            service_tier=tier,
        )
        object.__setattr__(checked, "_checked", True)
        return checked

    @property
    def lifetime(self) -> timedelta:
        """How long the hold would live: ``ttl``, or ``DEFAULT_TTL_SECONDS``."""
        if self.ttl is None:
            return timedelta(seconds=conf.DEFAULT_TTL_SECONDS)
        if isinstance(self.ttl, timedelta):
            return self.ttl
        return timedelta(seconds=self.ttl)

    def wire(self, *, query: bool = False) -> dict[str, Any]:
        """The request as the REST API takes it: the JSON body of ``POST /reservations``, or with
        ``query=True`` the parameters of ``GET /quote`` (strings; ``messages``, ``tags`` and
        ``max_tool_calls`` as JSON text). The idempotency key travels in its header, not here."""
        ttl = self.ttl
        if isinstance(ttl, timedelta):
            ttl = math.ceil(ttl.total_seconds())  # whole seconds, never shorter than asked
        values: dict[str, Any] = {
            "tenant": self.tenant,
            "end_user": self.end_user,
            "provider": self.provider,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "messages": self.messages,
            "prompt": self.prompt,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": None if self.max_tool_calls is None else dict(self.max_tool_calls),
            "tags": None if self.tags is None else dict(self.tags),
            "run": self.run,
            "ttl_seconds": ttl,
        }
        if query:
            text = {"messages", "max_tool_calls", "tags"}
            return {
                name: json.dumps(value) if name in text else str(value)
                for name, value in values.items()
                if value is not None
            }
        body = {name: value for name, value in values.items() if value is not None}
        body["max_output_tokens"] = self.max_output_tokens  # sent even when None (plan default)
        if self.allow_degrade:
            body["allow_degrade"] = True
        return body
