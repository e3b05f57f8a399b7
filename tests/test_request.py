"""``llm_budgets.request.Request``: one declaration of what a call asks, checked once (issue #24,
item 2). The same bad call is refused with the same code and field by every door: the Python
API's reserve, quote and explain, ``Request.of``, the REST API and the HTTP client."""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.test import Client

from llm_budgets import budgets, client
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.request import Request
from tests.api import BASE, client_for, new_key
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, seed

GOOD: dict[str, Any] = {
    "provider": FAKE_PROVIDER,
    "model": FAKE_MODEL,
    "input_tokens": 10,
    "max_output_tokens": 100,
}

# A bad call (changes to GOOD) and the field every door names. Each is refused by the services'
# checks, not by a serializer's shape (whose messages are DRF's): the REST API names the field
# as its body does (``ttl_seconds``).
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("blank model", {"model": " "}, "model"),
    ("invisible provider", {"provider": "fa\u200bke"}, "provider"),
    ("end user with a control", {"end_user": "u\x07"}, "end_user"),
    ("no input", {"input_tokens": None}, "input_tokens"),
    ("input tokens and a prompt", {"prompt": "Hello"}, "input_tokens"),
    ("too many tokens", {"input_tokens": 10**9}, "input_tokens"),
    ("zero output ceiling", {"max_output_tokens": 0}, "max_output_tokens"),
    ("run that names every run", {"run": "*"}, "run"),
    ("ttl too long", {"ttl": 10**7}, "ttl"),
    ("tag name with a bidi mark", {"tags": {"\u202eab": "x"}}, "tags"),
]
WIRE_NAMES = {"ttl": "ttl_seconds"}


def call(**changes: Any) -> dict[str, Any]:
    return {k: v for k, v in {**GOOD, **changes}.items() if v is not None}


def refused(function: Any, **kwargs: Any) -> InvalidUsage:
    with pytest.raises(InvalidUsage) as info:
        function(**kwargs)
    return info.value


@pytest.mark.django_db
@pytest.mark.parametrize(("case", "changes", "field"), BAD, ids=[c for c, _, _ in BAD])
def test_the_python_api_refuses_a_bad_call_once_and_alike(
    case: str, changes: dict[str, Any], field: str
) -> None:
    seed()
    checked = refused(Request.of, tenant="acme", **call(**changes))
    assert (checked.code, checked.field) == ("invalid", field)
    for function in (budgets.reserve, budgets.quote, budgets.explain):
        error = refused(function, tenant="acme", **call(**changes))
        assert (error.code, error.field, error.message) == ("invalid", field, checked.message)


def in_process_http() -> httpx.Client:
    """An httpx client whose requests Django's test client serves, in this test's transaction."""
    django_client = Client()

    def serve(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        response = django_client.generic(
            request.method,
            path,
            data=request.content,
            content_type=request.headers.get("content-type", "application/json"),
            headers=headers,
        )
        return httpx.Response(
            response.status_code, content=response.content, headers=dict(response.items())
        )

    return httpx.Client(transport=httpx.MockTransport(serve))


@pytest.mark.django_db
@pytest.mark.parametrize(("case", "changes", "field"), BAD, ids=[c for c, _, _ in BAD])
def test_the_rest_api_and_the_client_name_the_same_field(
    case: str, changes: dict[str, Any], field: str
) -> None:
    seed()
    key = new_key("acme")
    named = WIRE_NAMES.get(field, field)
    rest = client_for(key)
    response = rest.post(f"{BASE}reservations", Request(**call(**changes)).wire(), format="json")
    assert response.status_code == 400, response.content
    assert (response.json()["error"]["code"], response.json()["error"]["field"]) == (
        "invalid",
        named,
    )
    quoted = rest.get(f"{BASE}quote", Request(**call(**changes)).wire(query=True))
    assert quoted.status_code == 400, quoted.content
    assert quoted.json()["error"]["field"] == named

    remote = client.BudgetsClient(f"http://testserver{BASE}", key, http=in_process_http())
    for function in (remote.reserve, remote.quote):
        error = refused(function, **call(**changes))
        assert (error.code, error.field) == ("invalid", named)


@pytest.mark.django_db
def test_explain_takes_messages_prompt_ttl_and_tool_calls() -> None:
    seed()
    asked = {"tenant": "acme", "provider": FAKE_PROVIDER, "model": FAKE_MODEL}
    by_prompt = budgets.explain(**asked, prompt="Hello there", max_output_tokens=100, ttl=600)
    assert by_prompt.quote.estimate.input_tokens > 0
    by_messages = budgets.explain(
        **asked,
        messages=[{"role": "user", "content": "Hello there"}],
        max_output_tokens=100,
        max_tool_calls={"web_search": 2},
    )
    assert by_messages.quote.estimate.input_tokens > 0
    # The same estimate as quote's, for the same call.
    same = budgets.quote(**asked, prompt="Hello there", max_output_tokens=100, ttl=600)
    assert by_prompt.amount == same.estimate.amount
    with pytest.raises(InvalidUsage) as no_input:
        budgets.explain(**asked, max_output_tokens=100)
    assert no_input.value.field == "input_tokens"


def parameters(function: Any) -> dict[str, Any]:
    return {
        name: (p.kind, p.default, p.annotation)
        for name, p in inspect.signature(function).parameters.items()
    }


def test_quote_and_explain_take_what_reserve_takes_but_how_to_hold_it() -> None:
    """A read holds nothing: no idempotency key to replay, no ladder to walk."""
    hold_only = {"idempotency_key", "allow_degrade"}
    reserve = parameters(budgets.reserve)
    assert parameters(budgets.quote) == {k: v for k, v in reserve.items() if k not in hold_only}
    assert parameters(budgets.explain) == parameters(budgets.quote)
    # Every parameter of reserve is a field of the Request (and the Request no more than what
    # a call can ask: reserve's, and the integrations' service tier).
    fields = set(inspect.signature(Request).parameters) - {"_checked"}
    assert fields == set(reserve) | {"service_tier"}


def test_a_checked_request_is_canonical_and_checked_once() -> None:
    asked = Request(
        tenant="\uff41cme",  # fullwidth: NFKC makes it "acme"
        model=FAKE_MODEL,
        input_tokens=1,
        max_tool_calls={"web_search": 0},
        ttl=timedelta(minutes=5),
    )
    checked = asked.checked()
    assert checked.tenant == "acme"
    assert checked.max_tool_calls == {}  # zero calls: no fee, dropped
    assert checked.tags == {}
    assert checked.service_tier == ""
    assert checked.lifetime == timedelta(minutes=5)
    assert checked.checked() is checked
    assert checked == Request.of(
        tenant="acme", model=FAKE_MODEL, input_tokens=1, ttl=timedelta(seconds=300)
    )
    assert Request.of(tenant="acme", model=FAKE_MODEL, input_tokens=1, ttl=300).lifetime == (
        checked.lifetime
    )


def test_the_wire_is_what_the_rest_api_takes() -> None:
    asked = Request(
        model="m", tenant="t", input_tokens=3, tags={"a": "b"}, ttl=60, allow_degrade=True
    )
    assert asked.wire() == {
        "model": "m",
        "tenant": "t",
        "input_tokens": 3,
        "tags": {"a": "b"},
        "ttl_seconds": 60,
        "max_output_tokens": None,
        "allow_degrade": True,
    }
    assert asked.wire(query=True) == {
        "model": "m",
        "tenant": "t",
        "input_tokens": "3",
        "tags": '{"a": "b"}',
        "ttl_seconds": "60",
    }


def test_the_request_module_is_in_the_bottom_layer() -> None:
    """It imports no model, service or engine module: the client uses it without Django."""
    import ast
    from pathlib import Path

    import llm_budgets.request as module

    allowed = {
        "llm_budgets",
        "llm_budgets.conf",
        "llm_budgets.exceptions",
        "llm_budgets.money",
        "llm_budgets.tags",
        "llm_budgets.usage",
        "llm_budgets.validation",
    }
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llm")
    }
    assert imported <= allowed


def test_a_request_cannot_be_marked_checked_by_hand() -> None:
    """Only ``checked()`` trusts a request: the flag is not a constructor argument."""
    with pytest.raises(TypeError):
        Request(model="m", _checked=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidUsage):
        Request(tenant="acme", model="m", input_tokens=-1).checked()


def test_a_timedelta_ttl_goes_on_the_wire_never_shorter() -> None:
    assert Request(model="m", ttl=timedelta(seconds=1.5)).wire()["ttl_seconds"] == 2


def test_a_surfaces_arguments_are_its_request() -> None:
    """``Request.from_arguments(locals())``: a method's ``self`` is no field; any other name
    that is none is refused, as a misspelt keyword is."""
    asked = Request.from_arguments({"self": object(), "tenant": "t", "model": "m", "ttl": 60})
    assert asked == Request(tenant="t", model="m", ttl=60)
    with pytest.raises(TypeError):
        Request.from_arguments({"model": "m", "ttl_seconds": 60})
