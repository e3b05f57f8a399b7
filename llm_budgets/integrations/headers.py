"""What a guarded request carries beside its body: headers, query parameters and the base URL.
Deny by default, like the parameters: a header may change what a call bills (a beta that
turns on long-context rates, a gateway routing to another model), so only those known to bill
nothing pass (:data:`FREE_HEADERS`, plus ``LLM_BUDGETS["GUARD_FREE_HEADERS"]``), and
``anthropic-beta`` is read value by value. The client's own ``default_headers``,
``default_query`` and ``base_url`` are checked when it is guarded; ``extra_headers`` and
``extra_query`` (merged over them) before each call is admitted, so a refusal leaves no hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.guarding import NotGuarded, given
from llm_budgets.pricing.tokens import count_input_tokens

if TYPE_CHECKING:
    from llm_budgets.integrations.guarding import Call

# Headers that bill nothing (lower case; "*" at the end: a prefix): tracing, request ids and
# idempotency keys, the SDKs' own, API versions, authentication and account selection (which
# account pays, not at what rate: a project's default service tier is read from the answer),
# and common gateways' authentication and metadata.
FREE_HEADERS = frozenset(
    {
        # tracing and request ids
        "traceparent",
        "tracestate",
        "baggage",
        "sentry-trace",
        "b3",
        "x-b3-*",
        "x-amzn-trace-id",
        "x-cloud-trace-context",
        "x-datadog-*",
        "x-request-id",
        "x-client-request-id",
        "x-correlation-id",
        # idempotency
        "idempotency-key",
        "x-idempotency-key",
        # the SDKs' own and plain HTTP
        "x-stainless-*",
        "user-agent",
        "accept",
        "accept-encoding",
        "accept-language",
        "content-type",
        # provider versions, authentication and accounts
        "anthropic-version",
        "anthropic-dangerous-direct-browser-access",
        "authorization",
        "x-api-key",
        "api-key",
        "openai-organization",
        "openai-project",
        "ocp-apim-subscription-key",
        # gateways: authentication and metadata only (not routing or fallback configs)
        "helicone-auth",
        "helicone-user-id",
        "helicone-property-*",
        "helicone-session-*",
        "cf-aig-authorization",
        "cf-aig-metadata",
    }
)
# anthropic-beta values that change no rate: what they enable is priced from the request
# (the ceiling held, thinking as output, caching and the tools' fees as reported, ``speed``
# at its rates) or bills nothing.
FREE_BETAS = frozenset(
    {
        "prompt-caching-2024-07-31",
        "pdfs-2024-09-25",
        "token-counting-2024-11-01",
        "message-batches-2024-09-24",
        "files-api-2025-04-14",
        "output-128k-2025-02-19",
        "output-300k-2026-03-24",
        "interleaved-thinking-2025-05-14",
        "fine-grained-tool-streaming-2025-05-14",
        "token-efficient-tools-2025-02-19",
        "structured-outputs-2025-11-13",
        "search-results-2025-06-09",
        "web-fetch-2025-09-10",
        "web-search-2025-03-05",
        "extended-cache-ttl-2025-04-11",
        # Only clearing edits pass: the body's context_management is checked with the call.
        "context-management-2025-06-27",
        "fast-mode-2026-02-01",
    }
)
# Long context: above this many input tokens the whole call bills at long-context rates the
# price table does not have; below it the beta changes nothing.
LONG_CONTEXT_BETA = "context-1m-"
LONG_CONTEXT_TOKENS = 200_000
# Query parameters that bill nothing (Azure's API version).
FREE_QUERY = frozenset({"api-version"})

_ALLOW = (
    "If it bills nothing, add it to LLM_BUDGETS['GUARD_FREE_HEADERS'] ({entry!r}); if it "
    "changes the price, reserve with budgets.reserve(...) and use client.unguarded."
)


def _split(entries: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...], frozenset[str]]:
    """Entries as exact names, prefixes and ``name: value`` pairs (normalised ``name:value``)."""
    names, prefixes, pairs = set(), [], set()
    for entry in entries:
        if ":" in entry:
            name, value = (part.strip() for part in entry.split(":", 1))
            pairs.add(f"{name}:{value}")
        elif entry.endswith("*"):
            prefixes.append(entry[:-1])
        else:
            names.add(entry)
    return frozenset(names), tuple(prefixes), frozenset(pairs)


_FREE_NAMES, _FREE_PREFIXES, _NO_PAIRS = _split(FREE_HEADERS)


def _allowed(name: str, value: str) -> bool:
    """Whether header ``name`` (lower case) with ``value`` bills nothing: the built-in list
    first, then the setting (read only when needed: the common headers never reach it)."""
    if name in _FREE_NAMES or name.startswith(_FREE_PREFIXES):
        return True
    names, prefixes, pairs = _split(conf.GUARD_FREE_HEADERS)
    return name in names or name.startswith(prefixes) or f"{name}:{value}" in pairs


def check_headers(
    headers: Mapping[str, object] | None, *, field: str, call: Call | None = None
) -> None:
    """``NotGuarded`` for a header that may change the price and is not known to bill nothing.
    ``call``: the request being admitted (a long-context beta is then checked against its
    input); None when a client is being guarded (checked again at each call)."""
    if not headers:
        return
    if not isinstance(headers, Mapping):
        raise InvalidUsage(f"{field} must be a dict of header names to values.", field=field)
    for raw_name, raw_value in headers.items():
        if not given(raw_value):
            continue  # the SDKs' Omit removes a header: nothing is sent
        name, value = str(raw_name).strip().lower(), str(raw_value).strip()
        if name == "anthropic-beta":
            _check_betas(value, field=field, call=call)
        elif not _allowed(name, value):
            raise NotGuarded(
                f"the {raw_name!r} header ({field})",
                instead="The guard does not know whether it changes what the call bills. "
                + _ALLOW.format(entry=name),
            )


def _check_betas(value: str, *, field: str, call: Call | None) -> None:
    for beta in filter(None, (part.strip() for part in value.split(","))):
        if beta in FREE_BETAS or _allowed("anthropic-beta", beta):
            continue
        if beta.startswith(LONG_CONTEXT_BETA):
            if call is not None:
                _check_long_context(beta, call, field=field)
            continue
        raise NotGuarded(
            f"anthropic-beta {beta!r} ({field})",
            instead="A beta may bill above the price table's rates (code execution time, MCP, "
            "computer use...). " + _ALLOW.format(entry=f"anthropic-beta: {beta}"),
        )


def _check_long_context(beta: str, call: Call, *, field: str) -> None:
    """A prompt that may pass the long-context threshold is refused: its rates are not in the
    price table. One that cannot (counted as admission counts it) bills the standard rates."""
    tokens = (
        count_input_tokens(provider=call.options.provider, model=call.model, messages=call.messages)
        + call.extra_input_tokens
    )
    if tokens > LONG_CONTEXT_TOKENS:
        raise NotGuarded(
            f"anthropic-beta {beta!r} ({field}) with about {tokens:,} input tokens",
            instead=f"Above {LONG_CONTEXT_TOKENS:,} input tokens the whole call bills at "
            "long-context rates the price table does not have: send a shorter prompt, or "
            "reserve with budgets.reserve(...) and use client.unguarded.",
        )


def check_query(query: Mapping[str, object] | None, *, field: str) -> None:
    """``NotGuarded`` for a query parameter other than the few that bill nothing."""
    if not query:
        return
    if not isinstance(query, Mapping):
        raise InvalidUsage(f"{field} must be a dict of query parameters.", field=field)
    for name, value in query.items():
        if given(value) and str(name).lower() not in FREE_QUERY:
            raise NotGuarded(
                f"the {name!r} query parameter ({field})",
                instead=f"Only {', '.join(sorted(FREE_QUERY))} passes: a query parameter may "
                "change what the provider runs. Reserve with budgets.reserve(...) and use "
                "client.unguarded for anything else.",
            )


def check_base_url(url: object) -> None:
    """An http(s) URL with a host. Which host is not checked: prices follow ``provider=``,
    and hosts send through gateways and proxies of their own."""
    parts = urlsplit(str(url))
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidUsage(
            f"base_url must be an http(s) URL with a host; got {str(url)!r}.", field="base_url"
        )


def check_client(client: Any) -> None:
    """The client's own base URL, default headers and default query (SDK internals: what the
    caller set, not the headers the SDK adds itself)."""
    check_base_url(client.base_url)
    check_headers(getattr(client, "_custom_headers", None), field="default_headers")
    check_query(getattr(client, "_custom_query", None), field="default_query")


def check_call(method: Any, kwargs: Mapping[str, Any], call: Call) -> None:
    """Before ``call`` is admitted: ``extra_headers`` merged over the default headers of the
    client ``method`` (a resource's bound method) belongs to, Anthropic's ``betas`` (sent as
    ``anthropic-beta``), and ``extra_query``."""
    client = getattr(getattr(method, "__self__", None), "_client", None)
    custom = getattr(client, "_custom_headers", None)
    extra = kwargs.get("extra_headers")
    if custom and not given(extra) and "anthropic-beta" not in {k.lower() for k in custom}:
        custom = None  # checked when the client was guarded: nothing depends on this call
    headers = dict(custom or {})
    if given(extra):
        if not isinstance(extra, Mapping):
            raise InvalidUsage("extra_headers must be a dict.", field="extra_headers")
        headers.update(extra)
    field = "extra_headers" if given(extra) else "default_headers"
    check_headers(headers, field=field, call=call)
    betas = kwargs.get("betas")  # anthropic's beta namespace sends them as anthropic-beta
    if given(betas):
        if isinstance(betas, str) or not isinstance(betas, list | tuple):
            raise InvalidUsage("betas must be a list of beta names.", field="betas")
        _check_betas(",".join(map(str, betas)), field="betas", call=call)
    extra_query = kwargs.get("extra_query")
    if given(extra_query):
        check_query(extra_query, field="extra_query")
