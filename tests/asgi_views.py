"""Async views of the test project (not of the app), served by uvicorn in the ASGI tests
(tests/test_async_asgi.py, ``tests/servers.asgi_server``): what a host's async view does with
the public API's twins. Settings: ``tests/asgi_settings.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded
from tests.factories import FAKE_MODEL, FAKE_PROVIDER

CALL = {"provider": FAKE_PROVIDER, "model": FAKE_MODEL, "input_tokens": 0}


async def reserve(request: HttpRequest) -> HttpResponse:
    """Hold the seed scenario's 30 for ``?tenant=`` (``&key=``: an idempotency key)."""
    try:
        hold = await budgets.areserve(
            tenant=request.GET.get("tenant", "acme"),
            max_output_tokens=1000,
            idempotency_key=request.GET.get("key"),
            **CALL,
        )
    except BudgetExceeded as refusal:
        return JsonResponse({"refused": refusal.code}, status=429)
    return JsonResponse({"id": str(hold.id), "state": hold.state})


async def stream(request: HttpRequest) -> StreamingHttpResponse:
    """A streamed call: hold, send a chunk every 10 ms until the client goes away (a provider
    that never ends), and settle. ``?commit=1`` commits what was sent when the stream stops (the
    docs' streamed view); without it, leaving the block settles by the with-block policy."""
    commit = request.GET.get("commit") == "1"

    async def body() -> AsyncIterator[str]:
        async with budgets.areserve(tenant="acme", max_output_tokens=1000, **CALL) as hold:
            sent = 0
            try:
                yield f"{hold.id}\n"
                while True:
                    await asyncio.sleep(0.01)  # the provider's next chunk
                    sent += 1
                    yield "chunk\n"
            finally:
                if commit:
                    await hold.acommit(input_tokens=0, output_tokens=sent)

    return StreamingHttpResponse(body(), content_type="text/plain")


urlpatterns = [path("reserve", reserve), path("stream", stream)]
