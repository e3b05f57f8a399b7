"""Side doors of a guarded client (issue #39 item 1): the HTTP transport that refuses billable
requests the guard is not sending, ``.unguarded``, headers, query parameters and the base URL.
Real ``openai`` / ``anthropic`` clients against the fake providers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from asgiref.sync import async_to_sync
from django.core.checks import run_checks
from django.test import override_settings

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations import anthropic as guard_anthropic
from llm_budgets.integrations import openai as guard_openai
from llm_budgets.integrations.guarding import NotGuarded
from llm_budgets.integrations.headers import LONG_CONTEXT_TOKENS, check_call
from llm_budgets.integrations.proxy import ClientProxy
from llm_budgets.integrations.transport import billable
from llm_budgets.models import Reservation
from llm_budgets.testing.fakes.anthropic_server import FakeAnthropic
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT, FakeProvider
from tests.integrations import CLAUDE, GPT, seed_tenant

MESSAGES = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Sdk:
    """One SDK as the walk needs it: its clients, the guard, the billable request it tries."""

    name: str
    fake: Callable[[], FakeProvider]
    sync: Callable[..., Any]
    async_: Callable[..., Any]
    guard: Callable[..., Any]
    prefix: str  # what the base URL ends with
    path: str  # a billable path below the base URL
    body: dict[str, Any]
    # Keyword sets a ``create`` / ``parse`` / ``stream`` of a raw resource is tried with.
    calls: tuple[dict[str, Any], ...]


OPENAI = Sdk(
    name="openai",
    fake=FakeOpenAI,
    sync=openai.OpenAI,
    async_=openai.AsyncOpenAI,
    guard=guard_openai.guard,
    prefix="/v1",
    path="/chat/completions",
    body={"model": GPT, "messages": MESSAGES, "max_completion_tokens": 100},
    calls=(
        {"model": GPT, "messages": MESSAGES, "max_completion_tokens": 100},
        {"model": GPT, "input": "Say hello.", "max_output_tokens": 100},
        {"model": "text-embedding-3-small", "input": "Say hello."},
    ),
)
ANTHROPIC = Sdk(
    name="anthropic",
    fake=FakeAnthropic,
    sync=anthropic.Anthropic,
    async_=anthropic.AsyncAnthropic,
    guard=guard_anthropic.guard,
    prefix="",
    path="/v1/messages",
    body={"model": CLAUDE, "messages": MESSAGES, "max_tokens": 100},
    calls=({"model": CLAUDE, "messages": MESSAGES, "max_tokens": 100},),
)
SDKS = {"openai": OPENAI, "anthropic": ANTHROPIC}


@pytest.fixture(params=["openai", "anthropic"])
def sdk(request: pytest.FixtureRequest) -> Sdk:
    return SDKS[request.param]


@pytest.fixture
def fake(sdk: Sdk) -> Iterator[FakeProvider]:
    server = sdk.fake()
    yield server
    server.stop()


def _guarded(sdk: Sdk, fake: FakeProvider, *, is_async: bool = False, **client: Any) -> Any:
    make = sdk.async_ if is_async else sdk.sync
    raw = make(base_url=f"{fake.base_url}{sdk.prefix}", api_key="sk-test", timeout=WAIT, **client)
    return sdk.guard(raw, tenant="acme", end_user="u-1")


# -- the walk: every object reachable from a guarded client ------------------------------------

# The packages whose objects the walk follows (others are values: strings, numbers, locks...).
_FOLLOWED = ("openai", "anthropic", "httpx2", "httpcore2", "llm_budgets")
# The one documented escape hatch.
_SKIPPED = frozenset({"unguarded"})
_DEPTH = 4


@dataclass
class Walk:
    sdk: Sdk
    base_url: str
    is_async: bool
    outcomes: dict[str, str] = field(default_factory=dict)
    fresh: Any = None

    def url(self) -> str:
        return f"{self.base_url}{self.sdk.prefix}{self.sdk.path}"

    async def run(self, root: Any) -> None:
        # A client of the caller's own, handed to every with_options the walk finds.
        self.fresh = httpx2.AsyncClient() if self.is_async else httpx2.Client()
        seen: set[int] = set()
        frontier: list[tuple[str, Any]] = [("client", root)]
        for _ in range(_DEPTH + 1):
            found: list[tuple[str, Any]] = []
            for path, obj in frontier:
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
                for copied in await self.probe(path, obj):
                    await self.probe(*copied)  # a copy: tried, not walked (it is its original)
                found.extend(_children(path, obj))
            frontier = found

    async def probe(self, path: str, obj: Any) -> list[tuple[str, Any]]:
        """Try a billable request through ``obj`` by every way it offers; the copies it makes
        (``with_options``) are walked too."""
        made: list[tuple[str, Any]] = []
        fresh = self.fresh
        if isinstance(obj, ClientProxy):
            if getattr(type(obj), "with_options", None) is None:
                return made
            for options in ({}, {"http_client": fresh}):
                copied = await self.attempt(
                    f"{path}.with_options({options})", obj.with_options, **options
                )
                if copied is not None:
                    made.append((f"{path}.with_options({list(options)})", copied))
            return made
        if isinstance(obj, httpx2.BaseTransport):
            await self.attempt(f"{path}.handle_request", obj.handle_request, self.request())
        if isinstance(obj, httpx2.AsyncBaseTransport):
            await self.attempt(
                f"{path}.handle_async_request", obj.handle_async_request, self.request()
            )
        if isinstance(obj, httpx2.Client | httpx2.AsyncClient):
            await self.attempt(f"{path}.post", obj.post, self.url(), json=self.sdk.body)
            await self.attempt(f"{path}.send", obj.send, self.request())
        elif _is_sdk_client(obj):
            await self.attempt(
                f"{path}.post", obj.post, self.sdk.path, body=self.sdk.body, cast_to=object
            )
            for options in ({}, {"http_client": fresh}, {"max_retries": 0}):
                copied = await self.attempt(
                    f"{path}.with_options({options})", obj.with_options, **options
                )
                if copied is not None:
                    made.append((f"{path}.with_options({list(options)})", copied))
        elif type(obj).__module__.startswith("httpcore2") and callable(
            getattr(obj, "request", None)
        ):
            await self.attempt(f"{path}.request", obj.request, "POST", self.url(), content=b"{}")
        for name in ("create", "parse", "stream"):
            method = getattr(obj, name, None) if _is_sdk_object(obj) else None
            if callable(method):
                for kwargs in self.sdk.calls:
                    await self.attempt(f"{path}.{name}({sorted(kwargs)})", method, **kwargs)
        return made

    def request(self) -> httpx2.Request:
        return httpx2.Request("POST", self.url(), json=self.sdk.body)

    async def attempt(
        self, label: str, function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Call, await, enter and read what comes back; record how it ended."""
        try:
            result = function(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, WAIT)
            # A stream manager sends as it is entered (a client is not entered: leaving it
            # would close the httpx client its copies share).
            if _is_sdk_client(result) or isinstance(result, httpx2.Client | httpx2.AsyncClient):
                pass
            elif hasattr(result, "__aenter__"):
                async with result as entered:
                    result = entered
            elif hasattr(result, "__enter__"):
                with result as entered:
                    result = entered
        except BaseException as exc:
            self.outcomes[label] = "refused" if _refused(exc) else f"error {type(exc).__name__}"
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            return None
        self.outcomes[label] = "returned"
        return result


def _is_sdk_object(obj: object) -> bool:
    return type(obj).__module__.split(".")[0] in {"openai", "anthropic"}


def _is_sdk_client(obj: object) -> bool:
    return _is_sdk_object(obj) and isinstance(
        getattr(obj, "_client", None), httpx2.Client | httpx2.AsyncClient
    )


def _refused(exc: BaseException | None) -> bool:
    """NotGuarded, or an SDK error caused by it (Anthropic's SDK wraps what a transport
    raises)."""
    while exc is not None:
        if isinstance(exc, NotGuarded):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _children(path: str, obj: Any) -> list[tuple[str, Any]]:
    """Every attribute of ``obj`` (private ones too) worth following, and container items."""
    if isinstance(obj, dict):
        return [(f"{path}[{key!r}]", value) for key, value in obj.items() if _followed(value)]
    if isinstance(obj, list | tuple):
        return [(f"{path}[{i}]", value) for i, value in enumerate(obj) if _followed(value)]
    with warnings.catch_warnings():  # reading deprecated properties is not using them
        warnings.simplefilter("ignore")
        return _attributes(path, obj)


def _attributes(path: str, obj: Any) -> list[tuple[str, Any]]:
    names = set(dir(obj)) | set(getattr(obj, "__dict__", {}))
    if isinstance(obj, ClientProxy):  # what its __getattr__ hands out
        names |= set(obj._children) | obj._free | obj._refused
    found = []
    for name in sorted(names):
        if name.startswith("__") or name in _SKIPPED:
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # a refused attribute (NotGuarded), or one that cannot be read
            continue
        if _followed(value) or (isinstance(value, dict | list | tuple) and value):
            found.append((f"{path}.{name}", value))
    return found


def _followed(value: object) -> bool:
    if inspect.isclass(value) or inspect.ismodule(value) or inspect.isroutine(value):
        return False
    return type(value).__module__.split(".")[0] in _FOLLOWED


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_no_object_reachable_from_a_guarded_client_sends_a_billable_request(
    sdk: Sdk, fake: FakeProvider, is_async: bool
) -> None:
    walk = Walk(sdk=sdk, base_url=fake.base_url, is_async=is_async)
    asyncio.run(walk.run(_guarded(sdk, fake, is_async=is_async)))

    reached = [seen.path for seen in fake.requests if billable("POST", seen.path)]
    assert reached == [], {label: how for label, how in walk.outcomes.items() if how != "refused"}
    refused = [label for label, how in walk.outcomes.items() if how == "refused"]
    # The walk reached the doors named in the issue, and each was refused.
    for door in ("client._target.post", "client._target._client.post"):
        assert door in refused, sorted(walk.outcomes)
    resources = "chat" if sdk is OPENAI else "messages"
    assert any(label.startswith(f"client._target.{resources}") for label in refused)
    assert any("with_raw_response" in label for label in refused)
    assert any("with_options(['http_client'])" in label for label in refused)
    assert len(refused) >= 20, len(refused)


# -- what still passes ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_guards_own_calls_and_free_requests_pass_the_transport(
    sdk: Sdk, fake: FakeProvider
) -> None:
    seed_tenant()
    client = _guarded(sdk, fake)
    if sdk is OPENAI:
        client.chat.completions.create(**sdk.calls[0])
        client.responses.input_tokens.count(model=GPT, input="Say hello.")
        free = "/v1/responses/input_tokens"
    else:
        client.messages.create(**sdk.calls[0])
        client.messages.count_tokens(model=CLAUDE, messages=MESSAGES)
        free = "/v1/messages/count_tokens"
    assert [seen.path for seen in fake.requests] == [f"{sdk.prefix}{sdk.path}", free]
    assert Reservation.objects.count() == 1  # the guarded call; the free one holds nothing


@pytest.mark.django_db
def test_a_guarded_call_in_flight_lets_no_other_task_through() -> None:
    """The mark is per asyncio task (and per thread): while the guard's own request waits for
    its answer, a raw request from another task on the same client is still refused."""
    seed_tenant()
    fake = FakeOpenAI()
    try:
        client = _guarded(OPENAI, fake, is_async=True, max_retries=0)
        fake.then(kind="stall")

        async def scenario() -> None:
            guarded = asyncio.ensure_future(client.chat.completions.create(**OPENAI.calls[0]))
            await asyncio.get_running_loop().run_in_executor(None, fake.received.wait, WAIT)
            with pytest.raises(NotGuarded, match="POST /v1/chat/completions"):
                await client._target.post(OPENAI.path, body=OPENAI.body, cast_to=object)
            fake.unstall.set()
            with contextlib.suppress(openai.APIError):
                await guarded

        async_to_sync(scenario)()
        assert [seen.path for seen in fake.requests] == ["/v1/chat/completions"]
    finally:
        fake.stop()


def test_the_billable_rule() -> None:
    assert billable("POST", "/v1/chat/completions")
    assert billable("POST", "/openai/deployments/gpt/chat/completions")
    assert billable("POST", "/v1/responses")
    assert billable("PUT", "/v1/anything")
    assert not billable("GET", "/v1/models")
    assert not billable("DELETE", "/v1/files/file-1")
    assert not billable("POST", "/v1/files")
    assert not billable("POST", "/v1/messages/count_tokens")
    assert not billable("POST", "/v1/chat/completions/chatcmpl-1")  # metadata update
    assert not billable("POST", "/v1/responses/resp_1/cancel")


@pytest.mark.django_db
def test_unguarded_is_a_separate_copy_and_leaves_the_guard_in_place(
    sdk: Sdk, fake: FakeProvider
) -> None:
    seed_tenant()
    client = _guarded(sdk, fake, max_retries=3)
    raw = client.unguarded
    assert raw is not client._target
    assert raw.max_retries == 3  # the caller's own retries (the guard's copy sends with 0)
    raw.post(sdk.path, body=sdk.body, cast_to=object)
    assert [seen.path for seen in fake.requests] == [f"{sdk.prefix}{sdk.path}"]
    assert Reservation.objects.count() == 0  # the escape hatch: the caller holds it themselves
    # The guarded client is as guarded as before.
    with pytest.raises((NotGuarded, anthropic.APIConnectionError)) as refused:
        client._target.post(sdk.path, body=sdk.body, cast_to=object)
    assert _refused(refused.value)
    assert "POST /v1" in str(refused.value) + str(refused.value.__cause__)
    assert len(fake.requests) == 1
    # A resource's .unguarded is that resource on an unguarded copy.
    resource = client.chat.completions if sdk is OPENAI else client.messages
    assert type(resource.unguarded) is type(resource._target)
    assert resource.unguarded._client is not client._target


def test_websocket_sessions_of_the_sdk_copy_have_an_address_no_websocket_client_opens() -> None:
    """Realtime and responses.connect do not go through httpx: the guard's SDK copy, and every
    copy of it, get a WebSocket address with a scheme no WebSocket client accepts; .unguarded
    gets the caller's own."""
    raw = openai.OpenAI(api_key="sk-test", websocket_base_url="wss://gateway.example/v1")
    client = guard_openai.guard(raw, tenant="acme")
    copies = [
        client._target,
        client._target.with_options(websocket_base_url="wss://elsewhere.example/v1"),
        client._target.models._client.with_options(max_retries=1),
        client.with_options(timeout=5)._target,
    ]
    for copied in copies:
        url = copied.realtime.connect(model="gpt-realtime")._prepare_url()
        assert url.scheme not in {"ws", "wss"}, url
    assert client.unguarded.websocket_base_url == "wss://gateway.example/v1"
    assert raw.websocket_base_url == "wss://gateway.example/v1"  # the caller's client untouched


# -- headers, query, base_url -----------------------------------------------------------------


def _create(sdk: Sdk, client: Any, **extra: Any) -> Any:
    if sdk is OPENAI:
        return client.chat.completions.create(**sdk.calls[0], **extra)
    return client.messages.create(**sdk.calls[0], **extra)


@pytest.mark.django_db
def test_an_unknown_header_is_refused_before_admission_and_a_free_one_passes(
    sdk: Sdk, fake: FakeProvider
) -> None:
    seed_tenant()
    client = _guarded(sdk, fake)
    with pytest.raises(NotGuarded, match=r"x-portkey-config.*GUARD_FREE_HEADERS"):
        _create(sdk, client, extra_headers={"x-portkey-config": "pc-fallback"})
    assert (fake.requests, Reservation.objects.count()) == ([], 0)
    _create(sdk, client, extra_headers={"traceparent": "00-abc-def-01", "Idempotency-Key": "k1"})
    assert len(fake.requests) == 1


@pytest.mark.django_db
def test_the_setting_allows_more_headers(sdk: Sdk, fake: FakeProvider) -> None:
    seed_tenant()
    client = _guarded(sdk, fake)
    with override_settings(LLM_BUDGETS={"GUARD_FREE_HEADERS": ["x-my-gateway-*"]}):
        _create(sdk, client, extra_headers={"X-My-Gateway-Tag": "a"})
    assert len(fake.requests) == 1
    with pytest.raises(NotGuarded):
        _create(sdk, client, extra_headers={"X-My-Gateway-Tag": "a"})


def test_the_client_s_own_headers_query_and_base_url_are_checked_when_guarded(
    sdk: Sdk, fake: FakeProvider
) -> None:
    with pytest.raises(NotGuarded, match="default_headers"):
        _guarded(sdk, fake, default_headers={"x-route-to": "another-model"})
    with pytest.raises(NotGuarded, match="default_query"):
        _guarded(sdk, fake, default_query={"model": "another"})
    client = _guarded(
        sdk, fake, default_headers={"x-request-id": "r1"}, default_query={"api-version": "1"}
    )
    with pytest.raises(NotGuarded, match="default_headers"):
        client.with_options(default_headers={"x-route-to": "another-model"})
    with pytest.raises(InvalidUsage, match="base_url"):
        client.with_options(base_url="ftp://example.com/v1")
    assert fake.requests == []


@pytest.mark.django_db
def test_extra_query_is_refused_except_api_version(sdk: Sdk, fake: FakeProvider) -> None:
    seed_tenant()
    client = _guarded(sdk, fake)
    with pytest.raises(NotGuarded, match="'tier' query parameter"):
        _create(sdk, client, extra_query={"tier": "priority"})
    assert (fake.requests, Reservation.objects.count()) == ([], 0)
    _create(sdk, client, extra_query={"api-version": "2024-10-21"})
    assert len(fake.requests) == 1


@pytest.mark.django_db
def test_anthropic_betas_are_read_one_by_one() -> None:
    seed_tenant()
    fake = FakeAnthropic()
    try:
        client = _guarded(ANTHROPIC, fake)
        with pytest.raises(NotGuarded, match="code-execution"):
            _create(
                ANTHROPIC,
                client,
                extra_headers={
                    "anthropic-beta": "prompt-caching-2024-07-31,code-execution-2025-05-22"
                },
            )
        _create(
            ANTHROPIC,
            client,
            extra_headers={"anthropic-beta": "prompt-caching-2024-07-31, pdfs-2024-09-25"},
        )
        # Long context: fine while the prompt cannot pass the threshold, refused beyond it.
        _create(ANTHROPIC, client, extra_headers={"anthropic-beta": "context-1m-2025-08-07"})
        long_prompt = [{"role": "user", "content": "word " * (LONG_CONTEXT_TOKENS // 4)}]
        with pytest.raises(NotGuarded, match="long-context"):
            client.messages.create(
                model=CLAUDE,
                max_tokens=100,
                messages=long_prompt,
                extra_headers={"anthropic-beta": "context-1m-2025-08-07"},
            )
        # A client whose default headers carry it is checked at each call the same way.
        with_beta = client.with_options(default_headers={"anthropic-beta": "context-1m-2025-08-07"})
        with pytest.raises(NotGuarded, match="long-context"):
            with_beta.messages.create(model=CLAUDE, max_tokens=100, messages=long_prompt)
        assert len(fake.requests) == 2
        assert Reservation.objects.count() == 2
        # The beta namespace's betas= are sent as anthropic-beta: read the same way.
        with pytest.raises(NotGuarded, match=r"mcp-client.*\(betas\)"):
            check_call(client._target.messages.create, {"betas": ["mcp-client-2025-04-04"]}, None)
    finally:
        fake.stop()


@pytest.mark.django_db
def test_a_bad_free_headers_setting_fails_its_check() -> None:
    with override_settings(LLM_BUDGETS={"GUARD_FREE_HEADERS": "x-trace"}):
        ids = [message.id for message in run_checks(databases=[])]
    assert "llm_budgets.E140" in ids
    with override_settings(LLM_BUDGETS={"GUARD_FREE_HEADERS": ["x-trace", "anthropic-beta: b-1"]}):
        ids = [message.id for message in run_checks(databases=[])]
    assert "llm_budgets.E140" not in ids
