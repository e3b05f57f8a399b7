"""OpenAPI annotations that work without the host setting drf-spectacular's AutoSchema as
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema

F = TypeVar("F", bound=Callable[..., Any])


def api_schema(**kwargs: Any) -> Callable[[F], F]:
    """``extend_schema`` on a view method, based on drf-spectacular's AutoSchema whatever the
    host's default schema class is (extend_schema falls back to that default otherwise)."""

    def decorator(method: F) -> F:
        method.schema = AutoSchema  # type: ignore[attr-defined]
        return extend_schema(**kwargs)(method)

    return decorator
