"""Guarded calls from a Django view: who the end user is, and streaming to them.

.. code-block:: python

    from llm_budgets.exceptions import BudgetError
    from llm_budgets.integrations.django import error_response, request_end_user, stream_response

    def chat(request):
        end_user = request_end_user(request)  # LLM_BUDGETS["END_USER_ID"], as the pages
        client = guard(openai.OpenAI(), tenant=request.tenant_id, end_user=end_user)
        try:
            stream = client.chat.completions.create(model="gpt-4o", messages=[...],
                                                    max_completion_tokens=500, stream=True)
        except BudgetError as error:  # refused before anything was sent
            return error_response(error)
        return stream_response(stream)

The response sends the text of each chunk as it arrives. When the user goes away, the server
closes the response (WSGI calls its ``close()``; Django's ASGI handler cancels the body when it
receives ``http.disconnect``): the guarded stream is then closed, which closes the upstream
connection (the provider stops generating) and commits what was produced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from django.http import HttpRequest, JsonResponse, StreamingHttpResponse

from llm_budgets.api.exceptions import budget_error_answer
from llm_budgets.exceptions import BudgetError
from llm_budgets.host_users import end_user_id


def request_end_user(request: HttpRequest) -> str | None:
    """The end user a request's calls are recorded under: the logged-in user mapped by
    ``LLM_BUDGETS["END_USER_ID"]`` (the same rule the usage pages match a member by), or None
    for an anonymous visitor (the call then counts against the tenant only)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return end_user_id(user)


def error_response(error: BudgetError) -> JsonResponse:
    """The answer to a call llm_budgets refused or could not admit (any ``BudgetError``), as the
    REST API answers a tenant's key: its status (429 a budget, 403 a kill switch, 404 an unknown
    tenant, 503 the ledger unavailable, ...), ``{"error": {"code", "message", ...}}`` and
    ``Retry-After`` when the error says when to retry. A refusal by a budget every tenant shares
    is told without its figures (they are other tenants' spend)."""
    status, body, headers = budget_error_answer(error, for_tenant=True)
    return JsonResponse(body, status=status, headers=headers)


def chunk_text(chunk: Any) -> str:
    """The text an OpenAI chat chunk, Responses event or Anthropic event carries ("" if none)."""
    choices = getattr(chunk, "choices", None)
    if choices:
        delta = getattr(choices[0], "delta", None)
        return getattr(delta, "content", None) or ""
    kind = getattr(chunk, "type", "")
    if kind == "response.output_text.delta":
        return getattr(chunk, "delta", None) or ""
    if kind == "content_block_delta":
        return getattr(getattr(chunk, "delta", None), "text", None) or ""
    return ""


def stream_response(
    stream: Any,
    *,
    text: Callable[[Any], str] = chunk_text,
    content_type: str = "text/plain; charset=utf-8",
    **response_kwargs: Any,
) -> StreamingHttpResponse:
    """A ``StreamingHttpResponse`` of a guarded stream (sync or async): the text of each chunk
    (``text``). Closing the response (the client went away) closes the stream and settles."""
    if hasattr(stream, "__aiter__"):
        body: Iterator[str] | AsyncIterator[str] = _async_body(stream, text)
    else:
        body = _sync_body(stream, text)
    response = StreamingHttpResponse(body, content_type=content_type, **response_kwargs)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # let proxies pass chunks on as they come
    return response


def _sync_body(stream: Any, text: Callable[[Any], str]) -> Iterator[str]:
    try:
        for chunk in stream:
            piece = text(chunk)
            if piece:
                yield piece
    finally:
        stream.close()


async def _async_body(stream: Any, text: Callable[[Any], str]) -> AsyncIterator[str]:
    try:
        async for chunk in stream:
            piece = text(chunk)
            if piece:
                yield piece
    finally:
        await stream.close()
