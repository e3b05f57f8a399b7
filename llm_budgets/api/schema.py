"""OpenAPI annotations that work without the host setting drf-spectacular's AutoSchema as
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``, and that keep the app's endpoints out of a schema the
host generates (its own ``/api/schema/`` or ``manage.py spectacular``): they appear in the app's
own schema view only, unless ``LLM_BUDGETS["API_DOCS_IN_HOST_SCHEMA"]`` is True."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema

F = TypeVar("F", bound=Callable[..., Any])

# True while the app's own schema view generates its schema.
_own_schema: ContextVar[bool] = ContextVar("llm_budgets_own_schema", default=False)


@contextmanager
def own_schema() -> Iterator[None]:
    """Generate the app's own schema: its endpoints are included."""
    token = _own_schema.set(True)
    try:
        yield
    finally:
        _own_schema.reset(token)


class AppAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, excluded from any schema but the app's own (by default)."""

    def is_excluded(self) -> bool:
        from llm_budgets.conf import conf

        if not (_own_schema.get() or conf.API_DOCS_IN_HOST_SCHEMA):
            return True
        return super().is_excluded()


def api_schema(**kwargs: Any) -> Callable[[F], F]:
    """``extend_schema`` on a view method, based on drf-spectacular's AutoSchema whatever the
    host's default schema class is (extend_schema falls back to that default otherwise)."""

    def decorator(method: F) -> F:
        method.schema = AppAutoSchema  # type: ignore[attr-defined]
        return extend_schema(**kwargs)(method)

    return decorator
