"""What every guarded provider call shares: admission from the request, settlement from the
response, the classification of failures, and the accounting of a stream while it runs.

One :class:`Call` is one provider request. It reserves before anything is sent (the prompt counted
offline from the request, the output ceiling taken from it or from the plan), tells the SDK wrapper
which model and ceiling to send (the ones held), and settles exactly once:

- a response with usage: ``commit`` of that usage (the provider's own count, which is the bill:
  charged even beyond the hold, the excess flagged, ``engine.underestimates``), at the tier,
  speed and region the answer says it was billed at;
- a failure that proves nothing was billed (an HTTP 4xx, 503 or 529 answer, a refused connection,
  a call the SDK could not bind): ``release``; an SDK error that carries the answer: ``commit``
  of its usage;
- a timeout, a connection lost after the request was sent, a 5xx that may follow generation, a
  cancelled wait for the answer: ``mark_uncertain`` (DESIGN.md's lifecycle: the hold stays counted
  until real usage arrives or the reconcile job settles it);
- a stream the consumer stopped early, or one a kill switch stopped: ``commit`` of what was
  produced, counted from the deltas (:class:`OutputCounter`), with the provider's input count when
  it sent one (Anthropic's ``message_start``) and the request's offline count otherwise, plus
  the worst case of what it had not shown yet: the ceiling for a model that thinks or reasons
  unseen, and every server tool it showed starting at its fee and result bound.

Kill switches are checked while a stream runs, at most every ``switch_check_seconds`` (one indexed
query, :func:`llm_budgets.control.killswitches.kill_switches_covering`), when a chunk arrives and
while a read waits (:mod:`llm_budgets.integrations.streams`): a switch tripped mid-stream is noticed
within about ``switch_check_seconds``, stalled stream or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.control.killswitches import kill_switches_covering, refusal_for
from llm_budgets.engine import admission, settlement
from llm_budgets.exceptions import (
    BudgetError,
    Fault,
    InvalidUsage,
    KillSwitchActive,
    LedgerUnavailable,
    UnknownPrice,
)
from llm_budgets.pricing.costs import MODIFIER_JOIN
from llm_budgets.pricing.tokens import count_input_tokens, text_counter
from llm_budgets.usage import Usage, usage_validate

if TYPE_CHECKING:
    from llm_budgets.models import Reservation

logger = logging.getLogger("llm_budgets")

# The default bound on noticing a kill switch mid-stream (plus the gap between two chunks).
SWITCH_CHECK_SECONDS = 0.5
# HTTP answers that say the provider refused the work before generating anything.
_REFUSED_STATUSES = frozenset({503, 529})


class NotGuarded(BudgetError, NotImplementedError):
    """A guarded client was asked for a call that costs money and that the guard cannot price."""

    code = "not_guarded"
    fault = Fault.CALLER  # a call to make another way (the message says how), not an outage

    def __init__(self, what: str, *, instead: str) -> None:
        self.what = what
        super().__init__(
            f"{what} is not guarded by llm_budgets: it costs money and the guard cannot price "
            f"it, so it is refused rather than let through uncounted. {instead}",
            what=what,
        )


@dataclass(frozen=True)
class GuardOptions:
    """What ``guard(client, ...)`` was given; the same for every call through that client."""

    tenant: str
    end_user: str | None = None
    tags: Mapping[str, str] | None = None
    allow_degrade: bool = False
    provider: str = "openai"
    ttl: int | None = None
    switch_check_seconds: float = SWITCH_CHECK_SECONDS
    # The SDK client's own retries, made by the guard (the client is sent max_retries=0): each
    # attempt is one hold, so a timed-out attempt stays counted while the next one runs.
    max_retries: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.allow_degrade, bool):
            raise InvalidUsage("allow_degrade must be True or False.", field="allow_degrade")
        seconds = self.switch_check_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise InvalidUsage(
                "switch_check_seconds must be a number of seconds, 0 or more.",
                field="switch_check_seconds",
            )


class OutputCounter:
    """Output tokens counted from a stream's text deltas with the app's offline counter
    (``llm_budgets.pricing.tokens``): exactly with tiktoken for OpenAI-family models, else its
    conservative bound (one token per UTF-8 byte, times the safety margin). Never more than the
    ceiling that was held (the provider cannot exceed it), never less than one token a delta."""

    def __init__(self, *, provider: str, model: str, ceiling: int) -> None:
        self.provider = provider
        self.model = model
        self.ceiling = ceiling
        self.deltas = 0
        self._counted = 0
        # Deltas are counted when the count is asked for (``tokens``): a stream that ends with
        # the provider's own usage, the common case, never needs it.
        self._pending: list[str] = []
        self._count = text_counter(provider, model)

    def add(self, text: str) -> None:
        if not text:
            return
        self.deltas += 1
        self._pending.append(text)

    @property
    def tokens(self) -> int:
        """The deltas' tokens, each delta counted on its own."""
        if self._pending:
            self._counted += sum(map(self._count, self._pending))
            self._pending.clear()
        return self._counted

    @property
    def produced(self) -> int:
        return min(max(self.tokens, self.deltas), self.ceiling)


def _caused_by_refused_connection(exc: BaseException) -> bool:
    """Whether the SDK's connection error wraps a refused connection (nothing was sent). The SDKs
    wrap httpx's (or httpx2's) ``ConnectError``; its class name is the same in both."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if any(klass.__name__ == "ConnectError" for klass in type(cause).__mro__):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def proves_nothing_billed(exc: BaseException, *, sdk_errors: SdkErrors) -> bool:
    """Whether a failure of the request (before any response body) proves the provider billed
    nothing: an HTTP 4xx, 503 or 529 answer, a refused connection, a call the SDK could not bind
    (``TypeError``: bad arguments, raised before any I/O) or the guard's own refusal. Everything
    else (timeouts, lost connections, other 5xx, a cancelled wait, an answer that failed to parse)
    may have been billed."""
    if isinstance(exc, sdk_errors.status):
        status = getattr(exc, "status_code", 0)
        return 400 <= status < 500 or status in _REFUSED_STATUSES
    if isinstance(exc, sdk_errors.timeout):
        return False
    if isinstance(exc, sdk_errors.connection):
        return _caused_by_refused_connection(exc)
    return isinstance(exc, TypeError | BudgetError)


# Search content (search results, retrieved file chunks) is billed as input of the same call.
# Held per allowed search: this bound, the guard's own (the providers publish none; OpenAI bills
# some models a fixed 8,000-token block, and issue #39's probe saw about 24,000 a search): a call
# whose results exceed it is charged what the provider billed, the excess as overage
# (``guard.underestimate``).
SEARCH_CONTENT_TOKENS_PER_USE = 40_000
# What a code interpreter call's output adds to the input when the model reads it back: the
# guard's own bound per container call, as above.
CODE_OUTPUT_TOKENS_PER_USE = 20_000
# Each server tool's result bound per use, where the guard has one of its own (a web fetch's is
# the request's ``max_content_tokens``, set by the call builder).
RESULT_TOKENS_PER_USE = {
    "web_search": SEARCH_CONTENT_TOKENS_PER_USE,
    "file_search": SEARCH_CONTENT_TOKENS_PER_USE,
    "code_interpreter": CODE_OUTPUT_TOKENS_PER_USE,
}


def _dimension(modifier: str) -> str:
    """Which dimension a modifier prices (``billing_modifiers``' argument)."""
    if modifier == "fast":
        return "speed"
    return "geo" if modifier.startswith("geo_") else "tier"


def billing_modifiers(*, tier: str = "", speed: str = "", geo: str = "") -> str:
    """A call's modifiers as ``Call.service_tier`` holds them: the non-standard ones of its
    service tier, speed and region of inference, joined in that fixed order
    (``billing_modifiers(speed="fast", geo="geo_us") == "fast+geo_us"``)."""
    return MODIFIER_JOIN.join(m for m in (tier, speed, geo) if m)


_RETRIED_STATUSES = frozenset({408, 409, 429})
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0


def retry_delay(exc: BaseException, *, attempt: int, call: Call) -> float | None:
    """Seconds to wait before the SDK's retry of a failed attempt (``attempt`` from 0), or None
    when it is not retried: the SDKs' own rule (timeouts, connection errors, 408, 409, 429 and
    5xx; the ``x-should-retry`` and ``retry-after`` headers), made by the guard so that each
    attempt is held and settled on its own."""
    if attempt >= call.options.max_retries:
        return None
    errors = call.sdk_errors
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    if isinstance(exc, errors.status):
        should = str(headers.get("x-should-retry", "")).lower()
        status = getattr(exc, "status_code", 0)
        if should == "false" or (
            should != "true" and status not in _RETRIED_STATUSES and status < 500
        ):
            return None
    elif not isinstance(exc, errors.timeout | errors.connection):
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            asked = float(headers.get(name, "")) / scale
        except ValueError:
            continue
        if 0 < asked <= 60:
            return asked
    return min(INITIAL_RETRY_DELAY * 2**attempt, MAX_RETRY_DELAY) * (1 - 0.25 * random.random())  # noqa: S311


@dataclass(frozen=True)
class SdkErrors:
    """An SDK's exception classes, so this module never imports an SDK."""

    status: type[BaseException]
    timeout: type[BaseException]
    connection: type[BaseException]


def _attempt_key() -> str:
    """The idempotency key of one attempt's hold: made here, since the SDK call has no place
    for one."""
    return f"guard-{uuid.uuid4()}"


@dataclass
class Call:
    """One guarded provider request, from admission to its one settlement."""

    options: GuardOptions
    model: str
    ceiling: int | None
    messages: list[dict[str, Any]]
    sdk_errors: SdkErrors
    # Server-side tool calls the request may make, held at their fees (e.g. {"web_search": 5}).
    max_tool_calls: dict[str, int] | None = None
    # The premium tier the call is sent at, held and charged at its rates ("": standard).
    service_tier: str = ""
    # Input the provider adds that the messages do not show (Anthropic's tool-use system prompt).
    extra_input_tokens: int = 0
    # The most input one use of a server tool may bring (its result), by fee name: charged
    # per started use when a stream is stopped before the results are reported.
    result_tokens_per_use: Mapping[str, int] = field(
        default_factory=lambda: dict(RESULT_TOKENS_PER_USE)
    )
    # Whether the model sent may think or reason unseen (set when the request is pinned): an
    # answer whose usage is unknown is then charged the held ceiling, never the visible text.
    reasons: bool = False
    streamed: bool = False
    hold: budgets.Hold | None = None
    counter: OutputCounter | None = None
    # Usage the provider reported before the end of a stream (Anthropic's message_start).
    partial_usage: Usage | None = None
    final_usage: Usage | None = None
    # What an SDK module keeps between a stream's events (e.g. Anthropic's message_start usage).
    state: dict[str, Any] = field(default_factory=dict)
    # Server tools a stream showed it started, by fee name: billed even if the stream is
    # stopped before their fees and results are reported (``_counted_usage``).
    started_tools: dict[str, int] = field(default_factory=dict)
    # The billing modifiers an answer says it was billed at, by dimension (``billed_at``).
    billed: dict[str, str] = field(default_factory=dict)
    _settled: bool = False
    _last_check: float = field(default=0.0)
    # The hold's idempotency key: an admission refused as ``LedgerUnavailable`` may still have
    # taken the hold (its answer lost after the database committed), so the retry asks with
    # the same key and gets that hold back instead of holding twice (issue #38).
    idempotency_key: str = field(default_factory=_attempt_key)

    # -- admission ---------------------------------------------------------------------------

    def admit(self) -> budgets.Hold:
        """Reserve, or raise the refusal; nothing has been sent yet. A ledger that could not
        answer (``LedgerUnavailable``) is asked again with the same idempotency key, as many
        times as the SDK's retries (``max_retries``), after its ``retry_after`` (at most
        ``MAX_RETRY_DELAY``)."""
        attempt = 0
        while True:
            try:
                return self._admitted(again=attempt > 0)
            except LedgerUnavailable as exc:
                time.sleep(self._readmit_delay(exc, attempt))
                attempt += 1

    async def aadmit(self) -> budgets.Hold:
        """``admit`` for async clients: the ledger through ``sync_to_async``, the wait on the
        event loop (never a sleeping thread that every sync call shares)."""
        attempt = 0
        while True:
            try:
                return await sync_to_async(self._admitted)(again=attempt > 0)
            except LedgerUnavailable as exc:
                await asyncio.sleep(self._readmit_delay(exc, attempt))
                attempt += 1

    def _readmit_delay(self, exc: LedgerUnavailable, attempt: int) -> float:
        """Seconds to wait before asking admission again (``attempt`` from 0), or ``exc``
        raised when the retries are spent."""
        if attempt >= self.options.max_retries:
            raise exc
        logger.warning(
            "llm_budgets: admission refused (%s); asking again with idempotency key %s (%d of %d)",
            exc.code,
            self.idempotency_key,
            attempt + 1,
            self.options.max_retries,
        )
        return min(float(exc.retry_after), MAX_RETRY_DELAY)

    def _admitted(self, *, again: bool) -> budgets.Hold:
        self.hold = budgets.Hold(self._reserve(again=again))
        self.counter = OutputCounter(
            provider=self.options.provider,
            model=self.hold.model,
            ceiling=self.hold.max_output_tokens,
        )
        self._last_check = time.monotonic()
        return self.hold

    def _reserve(self, *, again: bool) -> Reservation:
        """The hold, under this attempt's key: looked up first only when asking ``again``
        (the key was made for this attempt, so its first admission cannot find it)."""
        # Through admission itself: the public reserve() takes no service tier yet (the REST API
        # and its client would need it too); admission prices the tier and records it.
        return admission.reservation_create(
            tenant=self.options.tenant,
            end_user=self.options.end_user,
            provider=self.options.provider,
            model=self.model,
            input_tokens=count_input_tokens(
                provider=self.options.provider, model=self.model, messages=self.messages
            )
            + self.extra_input_tokens,
            max_output_tokens=self.ceiling,
            allow_degrade=self.options.allow_degrade,
            tags=dict(self.options.tags) if self.options.tags else None,
            ttl=self.options.ttl,
            max_tool_calls=self.max_tool_calls,
            service_tier=self.service_tier or None,
            idempotency_key=self.idempotency_key,
            new_key=not again,
        )

    def billed_at(self, **modifiers: str | None) -> None:
        """What an answer says of its own billing, by dimension (``tier``: ``"priority"``,
        ``"flex"``; ``speed``: ``"fast"``; ``geo``: ``"geo_us"``; ``""`` for standard, None when
        the answer does not say): the commit charges at these, the hold's for the rest."""
        self.billed.update({k: v for k, v in modifiers.items() if v is not None})

    @property
    def billed_tier(self) -> str | None:
        """The modifiers the provider billed at (``Call.service_tier``'s form), or None when no
        answer said: the ones held."""
        if not self.billed:
            return None
        held = {_dimension(m): m for m in self.service_tier.split(MODIFIER_JOIN) if m}
        return billing_modifiers(**{**held, **self.billed})

    def tool_started(self, name: str) -> None:
        """A stream showed a server tool call starting (its fee is billed whatever follows)."""
        self.started_tools[name] = self.started_tools.get(name, 0) + 1

    def fresh(self) -> Call:
        """The same request as a new, unadmitted call: the SDK's retry of it gets its own hold."""
        return replace(
            self,
            hold=None,
            counter=None,
            partial_usage=None,
            final_usage=None,
            state={},
            started_tools={},
            billed={},
            reasons=False,
            streamed=False,
            _settled=False,
            idempotency_key=_attempt_key(),  # another attempt: another hold
        )

    @property
    def model_sent(self) -> str:
        """The model the provider is asked for: the one held (a degraded one, if granted)."""
        assert self.hold is not None
        return self.hold.model

    @property
    def ceiling_sent(self) -> int:
        """The output ceiling sent: the one held, so the provider can never bill past the hold."""
        assert self.hold is not None
        return self.hold.max_output_tokens

    # -- settlement --------------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        return self._settled

    def succeeded(self, usage: Usage | None) -> None:
        """The provider answered in full: commit its usage (or, without usage, what was
        counted)."""
        if self._settled or self.hold is None:
            return
        self._settled = True
        self._commit(usage if usage is not None else self._counted_usage())

    def _commit(self, usage: Usage) -> None:
        """Commit what the provider billed: its usage is the bill, charged even beyond the hold
        (as overage, flagged: ``engine.underestimates``), at the modifiers the answer says it
        was billed at. An answer billed at modifiers no price covers leaves the hold counted
        (uncertain) rather than charged at the wrong rates."""
        assert self.hold is not None
        with self._settling("commit"):
            try:
                result = settlement.reservation_commit_provider_usage(
                    self.hold.id, usage=usage, service_tier=self.billed_tier
                )
            except UnknownPrice as exc:
                logger.warning(
                    "llm_budgets: reservation %s was answered at service tier %r, which its "
                    "price does not cover (%s); its hold stays counted (uncertain).",
                    self.hold.id,
                    self.billed_tier,
                    exc,
                )
                self.hold.mark_uncertain()
                return
            self.hold.reservation.state = result.state

    def failed(self, exc: BaseException) -> None:
        """The request failed before a response body: release if that proves nothing was
        billed, else keep the hold counted (uncertain)."""
        if self._settled or self.hold is None:
            return
        self._settled = True
        if proves_nothing_billed(exc, sdk_errors=self.sdk_errors):
            with self._settling("release"):
                self.hold.release()
        else:
            logger.warning(
                "llm_budgets: provider call of reservation %s ended in %s; its hold stays "
                "counted (uncertain).",
                self.hold.id,
                type(exc).__name__,
            )
            with self._settling("mark uncertain"):
                self.hold.mark_uncertain()

    def lost(self, exc: BaseException) -> None:
        """A stream broke after the request was sent (connection lost, read timeout, an error
        event): the provider may bill for all of it, so the hold stays counted (uncertain)."""
        if self._settled or self.hold is None:
            return
        self._settled = True
        logger.warning(
            "llm_budgets: stream of reservation %s broke (%s); its hold stays counted (uncertain).",
            self.hold.id,
            type(exc).__name__,
        )
        with self._settling("mark uncertain"):
            self.hold.mark_uncertain()

    def stopped(self) -> None:
        """The consumer stopped the stream early (or a kill switch did): commit what was
        produced, counted from the deltas."""
        if self._settled or self.hold is None:
            return
        self._settled = True
        self._commit(self.final_usage or self._counted_usage())

    @contextlib.contextmanager
    def _settling(self, action: str) -> Iterator[None]:
        """After the provider was called, a ledger that cannot be written must not cost the
        caller the answer it paid for (or hide the provider's own error): the failure is logged
        and the hold stays as it is, counted, until the sweep charges it as estimated spend."""
        try:
            yield
        except BudgetError:
            assert self.hold is not None
            logger.exception(
                "llm_budgets: could not %s reservation %s after the provider call; its hold "
                "stays counted until it expires (then charged as estimated).",
                action,
                self.hold.id,
            )

    def _counted_usage(self) -> Usage:
        """Usage when the provider's own count is missing (a stream stopped before its final
        usage, an answer without one): what was produced plus the worst case of what could not
        be seen. Output: the held ceiling when the model may think or reason unseen (asked for,
        or a thinking or reasoning item shown) or the answer was not streamed, else the output
        counted from the deltas; never above the ceiling sent. Every server tool the stream
        showed starting, at its fee, and its result at the per-use bound as input where the
        input count is the provider's (Anthropic's ``message_start``, which precedes the
        results); the offline count already holds every allowed use's result."""
        assert self.hold is not None
        assert self.counter is not None
        if self.reasons or not self.streamed:
            produced = self.hold.max_output_tokens
        else:
            produced = self.counter.produced
        tools = dict(self.started_tools) or None
        if self.partial_usage is None:
            return usage_validate(
                input_tokens=self.hold.reservation.input_tokens,
                output_tokens=produced,
                tool_calls=tools,
            )
        partial = self.partial_usage
        results = self._started_results()
        return replace(
            partial,
            input_tokens=(
                max(partial.input_tokens, self.hold.reservation.input_tokens)
                if results is None
                else partial.input_tokens + results
            ),
            output_tokens=max(partial.output_tokens, produced),
            tool_calls={**partial.tool_calls, **(tools or {})},
        )

    def _started_results(self) -> int | None:
        """The input the started server tools' results may bring, at each use's bound
        (``result_tokens_per_use``); None when a started tool has none (the whole held input,
        which holds every allowed use's result, is then charged)."""
        total = 0
        for name, uses in self.started_tools.items():
            per_use = self.result_tokens_per_use.get(name)
            if per_use is None:
                return None
            total += uses * per_use
        return total

    # -- while streaming ---------------------------------------------------------------------

    def seconds_since_check(self) -> float:
        return time.monotonic() - self._last_check

    def switch_check_due(self) -> bool:
        """Whether ``switch_check_seconds`` have passed since the last look (no query)."""
        return self.seconds_since_check() >= self.options.switch_check_seconds

    def check_switches(self, *, force: bool = False) -> KillSwitchActive | None:
        """A kill switch that now covers the call, read at most every ``switch_check_seconds``
        (one indexed query); None if none (or not time to look)."""
        if not force and not self.switch_check_due():
            return None
        self._last_check = time.monotonic()
        assert self.hold is not None
        reservation = self.hold.reservation
        models = {reservation.model}
        if reservation.price is not None:
            models.add(reservation.price.model)
        switches = kill_switches_covering(
            tenant_id=reservation.tenant_id,
            end_user_id=reservation.end_user_id,
            provider=reservation.provider,
            models=models,
            now=timezone.now(),
        )
        if not switches:
            return None
        return refusal_for(
            switches[0],
            tenant=reservation.tenant.external_id,
            end_user=reservation.end_user.external_id if reservation.end_user else None,
            model=reservation.requested_model or reservation.model,
        )


# Content that is billed but cannot be counted offline before the call: an image or a file
# (by URL its size is unknown; the guard applies no per-provider image rule), audio, an item
# brought by reference. Refused wherever it appears, tool results included.
MEDIA_TYPES = frozenset(
    {
        "image",
        "image_url",
        "input_image",
        "document",
        "file",
        "input_file",
        "input_audio",
        "audio",
        "container_upload",
        "computer_call_output",
        "computer_screenshot",
        "image_generation_call",
        "item_reference",
    }
)
# Parts sent as structured data: counted as their JSON text (a fair bound), media refused inside.
_JSON_PARTS = frozenset(
    {
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "search_result",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "thinking",
        "redacted_thinking",
        "reasoning",
    }
)


def media_in(value: object) -> str | None:
    """The type of the first image, file or audio part anywhere inside ``value``, else None."""
    if isinstance(value, Mapping):
        kind = value.get("type")
        if isinstance(kind, str) and kind in MEDIA_TYPES:
            return kind
        for item in value.values():
            found = media_in(item)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for item in value:
            found = media_in(item)
            if found:
                return found
    return None


def refuse_media(value: object, *, field_name: str) -> None:
    kind = media_in(value)
    if kind is not None:
        raise InvalidUsage(
            f"{field_name} has a {kind!r} part (an image, file or audio, here or inside a tool "
            "result): it is billed, and its tokens cannot be counted offline before the call, "
            "so the guard cannot price it. Reserve with budgets.reserve(input_tokens=...) and "
            "call the unguarded client.",
            field=field_name,
        )


def text_of(content: object, *, field_name: str, text_types: frozenset[str]) -> str:
    """The text of a message's content: a string, or a list of text parts (types in
    ``text_types``) and structured parts (tool calls and results, thinking blocks), counted as
    their JSON. Images, files and audio anywhere inside (a tool result's too) cannot be counted
    offline: ``InvalidUsage`` says so."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in text_types:
                parts.append(str(part.get("text", "")))
            elif kind in _JSON_PARTS:
                refuse_media(part, field_name=field_name)
                parts.append(json.dumps(part, sort_keys=True, default=str))
            else:
                raise InvalidUsage(
                    f"{field_name} has a {kind or type(part).__name__!r} part: only text can be "
                    "counted offline before the call, so the guard cannot price it. Reserve "
                    "with budgets.reserve(input_tokens=...) and call the unguarded client.",
                    field=field_name,
                )
        return "\n".join(parts)
    raise InvalidUsage(f"{field_name} must be text or a list of text parts.", field=field_name)


def as_text_message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


def json_text(value: object) -> str:
    """Tool definitions and the like, as the text they are billed as (a fair bound)."""
    return json.dumps(value, sort_keys=True, default=str)


def with_extra_body(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters as the provider receives them: the SDK merges ``extra_body`` into the
    JSON body over the named parameters, so its keys are checked and priced as the same
    parameter would be. A key given both ways is refused (which one is sent is the SDK's
    detail, not the caller's intent)."""
    merged = {name: value for name, value in kwargs.items() if name != "extra_body"}
    extra = kwargs.get("extra_body")
    if not given(extra):
        return merged
    if not isinstance(extra, Mapping):
        raise InvalidUsage(
            "extra_body must be a dict of request fields (each is checked and priced as the "
            "same parameter would be).",
            field="extra_body",
        )
    twice = sorted(name for name in extra if given(merged.get(name)))
    if twice:
        raise InvalidUsage(
            f"{', '.join(twice)} given both as a parameter and in extra_body: give each once.",
            field="extra_body",
        )
    merged.update(extra)
    return merged


def given(value: object) -> bool:
    """Whether a keyword argument was given (the SDKs' ``omit``/``NOT_GIVEN`` sentinels and None
    mean not given)."""
    return value is not None and type(value).__name__ not in {"Omit", "NotGiven"}


def bound(value: object) -> int | None:
    """A bound the caller gave (``max_uses``, ``max_tool_calls``...): a whole number, 1 or more;
    None when it is missing or not one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


SwitchCheck = Callable[[], KillSwitchActive | None]


@dataclass(frozen=True)
class Parameters:
    """A guarded method's parameters, each classified: ``priced`` (the guard prices or pins
    it), ``neutral`` (no effect on what is billed), ``refused`` (name -> why). A parameter
    given that is none of these, such as one a new SDK release adds, is refused."""

    priced: frozenset[str]
    neutral: frozenset[str]
    refused: Mapping[str, str]

    def check(self, kwargs: Mapping[str, Any], *, where: str) -> None:
        """``NotGuarded`` for the first refused or unclassified parameter given."""
        for name, value in kwargs.items():
            # False turns a feature off (background=False): nothing to price.
            if not given(value) or value is False or name in self.priced or name in self.neutral:
                continue
            raise NotGuarded(
                f"{where}({name}=...)",
                instead=self.refused.get(
                    name, "The guard does not know what this parameter costs (not classified)."
                ),
            )

    def unclassified(self, method: Callable[..., Any]) -> set[str]:
        """The parameters of the installed SDK's ``method`` this classification misses."""
        names = set(inspect.signature(method).parameters) - {"self", "kwargs"}
        return names - self.priced - self.neutral - set(self.refused)


# Parameters of every guarded method with no effect on what is billed.
NEUTRAL_PARAMETERS = frozenset(
    {
        "extra_headers",
        "extra_query",
        "timeout",
        "metadata",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stop_sequences",
        "seed",
        "user",
        "safety_identifier",
        "store",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "frequency_penalty",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "verbosity",
    }
)
