"""The guards deny by default: every attribute of the installed SDKs' clients (and of the
resources with guarded calls) and every parameter of a guarded method is classified as guarded,
free or refused. A new SDK release that adds a resource or a parameter fails these tests until
it is classified; meanwhile the guard refuses it (``NotGuarded``), before anything is sent."""

from __future__ import annotations

import functools
from typing import Any

import anthropic
import openai
import pytest

from llm_budgets.integrations import anthropic as anthropic_guard
from llm_budgets.integrations import openai as openai_guard
from llm_budgets.integrations.guarding import NotGuarded
from llm_budgets.integrations.proxy import ClientProxy, public_names, unclassified


@pytest.mark.parametrize("module", [openai_guard, anthropic_guard])
def test_every_attribute_and_parameter_of_the_installed_sdk_is_classified(module: Any) -> None:
    assert module.UNCLASSIFIED == {}
    assert module.UNCLASSIFIED_PARAMETERS == {}


@pytest.mark.parametrize(
    ("proxy", "client"),
    [
        (openai_guard.GuardedOpenAI, openai.OpenAI(api_key="sk-test")),
        (anthropic_guard.GuardedAnthropic, anthropic.Anthropic(api_key="sk-test")),
    ],
)
def test_every_attribute_of_a_client_instance_is_classified(
    proxy: type[ClientProxy], client: Any
) -> None:
    # Instance attributes (set in __init__) are not on the class: read them from a client.
    assert public_names(client) - proxy.classified() - public_names(ClientProxy) == set()
    for name, child in proxy._children.items():
        resource = getattr(client, name)
        assert public_names(resource) - child.classified() - public_names(ClientProxy) == set()


class _NextRelease(openai.OpenAI):
    """The installed client as a future release might look: one resource more."""

    @functools.cached_property
    def agents(self) -> object:
        return object()


def test_a_resource_a_new_release_adds_is_unclassified_and_refused() -> None:
    found = unclassified(openai_guard.GuardedOpenAI, {"": (_NextRelease,)})
    assert found == {"client": {"agents"}}
    client = openai_guard.guard(_NextRelease(api_key="sk-test"), tenant="acme")
    with pytest.raises(NotGuarded, match="agents"):
        client.agents  # noqa: B018


def test_a_parameter_a_new_release_adds_is_unclassified_and_refused() -> None:
    def create(self: object, *, model: str, messages: object, cost_multiplier: int) -> None: ...

    assert openai_guard.CHAT_PARAMETERS.unclassified(create) == {"cost_multiplier"}
    client = openai_guard.guard(openai.OpenAI(api_key="sk-test"), tenant="acme")
    with pytest.raises(NotGuarded, match="cost_multiplier"):
        client.chat.completions.create(
            model="gpt-4o", messages=[], max_completion_tokens=1, cost_multiplier=2
        )
