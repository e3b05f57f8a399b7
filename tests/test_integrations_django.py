"""The Django view helper: a host view streams a guarded completion to its own user; when the
user goes away the server closes the response, which closes upstream and settles. Driven through
Django's own WSGI and ASGI handlers, as a server would drive them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from io import BytesIO
from typing import Any

import openai
import pytest
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.test import Client, override_settings
from django.urls import path

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetError, LedgerUnavailable
from llm_budgets.integrations.django import error_response, stream_response
from llm_budgets.integrations.openai import guard
from llm_budgets.testing.fakes.openai_server import FakeOpenAI
from llm_budgets.testing.fakes.server import WAIT
from tests.integrations import GPT, assert_conserved, charge_line, only_reservation, seed_tenant

pytestmark = pytest.mark.django_db

FAKE: dict[str, FakeOpenAI] = {}
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def sync_chat(request: HttpRequest) -> StreamingHttpResponse:
    client = guard(
        openai.OpenAI(base_url=f"{FAKE['server'].base_url}/v1", api_key="sk", max_retries=0),
        tenant="acme",
        end_user="u-1",
    )
    stream = client.chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    return stream_response(stream)


async def async_chat(request: HttpRequest) -> StreamingHttpResponse:
    client = guard(
        openai.AsyncOpenAI(base_url=f"{FAKE['server'].base_url}/v1", api_key="sk", max_retries=0),
        tenant="acme",
        end_user="u-1",
    )
    stream = await client.chat.completions.create(
        model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
    )
    return stream_response(stream)


def refusing_chat(request: HttpRequest) -> HttpResponseBase:
    """The view of docs/adopting.md: every error of the app answered with its own status. Its
    client points at a port nothing answers: a call that got past admission would fail."""
    client = guard(
        openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk", max_retries=0),
        tenant=request.GET["tenant"],
        end_user="u-1",
    )
    try:
        stream = client.chat.completions.create(
            model=GPT, messages=MESSAGES, max_completion_tokens=1000, stream=True
        )
    except BudgetError as error:
        return error_response(error)
    return stream_response(stream)


urlpatterns = [
    path("chat", sync_chat),
    path("achat", async_chat),
    path("refusing", refusing_chat),
]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    seed_tenant()
    server = FakeOpenAI()
    FAKE["server"] = server
    # As Django's test client does: the test's transaction must survive the request signals.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield server
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
    server.stop()


@override_settings(ROOT_URLCONF=__name__)
def test_a_streamed_view_read_to_the_end_is_charged_the_final_usage(fake: FakeOpenAI) -> None:
    environ = _environ("/chat")
    body = b"".join(WSGIHandler()(environ, lambda status, headers: None))
    assert body.decode() == "Hello from the fake. " * 3
    assert charge_line(only_reservation()).output_tokens == 12
    assert_conserved()


@override_settings(ROOT_URLCONF=__name__)
def test_a_user_who_leaves_a_wsgi_stream_closes_upstream_and_is_charged_what_was_sent(
    fake: FakeOpenAI,
) -> None:
    fake.then(chunks=200, delay=0.02)
    response = WSGIHandler()(_environ("/chat"), lambda status, headers: None)
    chunks = iter(response)
    assert next(chunks) == b"Hello from the fake. "
    response.close()  # what a WSGI server does when the client disconnects (PEP 3333)
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert 0 < charge_line(reservation).output_tokens < 1000
    assert_conserved()


@override_settings(ROOT_URLCONF=__name__)
def test_a_user_who_leaves_an_asgi_stream_closes_upstream_and_is_charged_what_was_sent(
    fake: FakeOpenAI,
) -> None:
    fake.then(chunks=200, delay=0.02)

    async def run() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        first_body = asyncio.Event()
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.wait_for(first_body.wait(), WAIT)
            return {"type": "http.disconnect"}  # the user closed the tab

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                first_body.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/achat",
            "raw_path": b"/achat",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"testserver")],
            "client": ("127.0.0.1", 5000),
            "server": ("testserver", 80),
        }
        await asyncio.wait_for(ASGIHandler()(scope, receive, send), WAIT)
        return sent

    sent = async_to_sync(run)()
    assert sent[0]["status"] == 200
    assert fake.last.client_closed.wait(WAIT), "upstream was not closed"
    reservation = only_reservation()
    assert reservation.state == "committed"
    assert 0 < charge_line(reservation).output_tokens < 1000
    assert_conserved()


def _environ(path_info: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path_info,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": BytesIO(),
        "wsgi.errors": BytesIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def _refused(tenant: str = "acme") -> tuple[int, dict[str, Any], str | None]:
    with override_settings(ROOT_URLCONF=__name__):
        response = Client().get("/refusing", {"tenant": tenant})
    return response.status_code, response.json()["error"], response.headers.get("Retry-After")


def test_a_view_answers_each_refusal_with_its_own_status() -> None:
    seed_tenant(limit="3000")  # the view's call holds 2026 (its output ceiling at 2 a token)
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=26, max_output_tokens=1000
    )
    status, error, retry_after = _refused()
    assert (status, error["code"]) == (429, "budget_exceeded")
    assert error["budget"]["limit"] == "3000"  # the tenant's own budget: its figures
    assert retry_after is not None
    assert int(retry_after) >= 1

    budgets.trip(tenant="acme", reason="runaway loop", actor="ops")
    status, error, retry_after = _refused()
    assert (status, error["code"], error["reason"]) == (403, "kill_switch_active", "runaway loop")
    assert retry_after is None

    status, error, _ = _refused(tenant="nobody")
    assert (status, error["code"]) == (404, "unknown_tenant")


def test_a_refusal_by_the_shared_budget_is_told_without_its_figures() -> None:
    seed_tenant()
    budgets.set_limit(amount="3000", window="day")  # installation-wide: every tenant's spend
    budgets.reserve(
        tenant="acme", provider="openai", model=GPT, input_tokens=26, max_output_tokens=1000
    )
    status, error, retry_after = _refused()
    assert (status, error["code"]) == (429, "budget_exceeded")
    assert error["budget"]["limit"] is None
    assert error["budget"]["remaining"] is None
    assert "installation-wide" in error["message"]
    assert retry_after is not None


def test_a_ledger_that_cannot_answer_is_a_503_with_retry_after() -> None:
    response = error_response(LedgerUnavailable("the ledger did not answer", retry_after=2))
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert json.loads(response.content)["error"]["code"] == "ledger_unavailable"
