"""Helpers for the REST API tests: keys, clients and the API's base path."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from llm_budgets.control.api_keys import api_key_create

BASE = "/api/llm-budgets/v1/"


def new_key(tenant: str | None = None, **kwargs: Any) -> str:
    """A fresh key: for ``tenant``, or an operator key."""
    _, key = api_key_create(tenant=tenant, name=kwargs.pop("name", "test"), **kwargs)
    return key


def client_for(key: str | None) -> APIClient:
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client


def reserve_body(**overrides: Any) -> dict[str, Any]:
    """The seed request over HTTP: model fake/m30 at 1000 output tokens holds exactly 30."""
    body: dict[str, Any] = {
        "provider": "fake",
        "model": "m30",
        "input_tokens": 0,
        "max_output_tokens": 1000,
    }
    body.update(overrides)
    return body
