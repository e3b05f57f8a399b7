"""The OpenAPI schema of this API alone, and a Swagger UI served from the installed
drf-spectacular-sidecar package (never a CDN), whatever the host's SPECTACULAR_SETTINGS say.
Who may read them follows ``LLM_BUDGETS["API_DOCS_ACCESS"]`` (docs/api.md)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpResponse
from django.urls import include, path
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView, _get_sidecar_url
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

import llm_budgets
from llm_budgets.api.schema import api_schema, own_schema
from llm_budgets.api.views import NoStore
from llm_budgets.conf import conf

SCHEMA_PATH = "schema/"

SCHEMA_SETTINGS = {
    "TITLE": "llm_budgets API",
    "DESCRIPTION": (
        "Admit LLM calls before they run against every budget that applies, hold their "
        "worst-case cost, settle the real cost afterwards. Send `Authorization: Api-Key <key>`."
    ),
    "VERSION": llm_budgets.__version__,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "llm_budgets.api.docs.add_links",
    ],
}

# OpenAPI links: how a reservation's answer feeds the operations on it (clients and stateful
# testers such as schemathesis follow them).
RESERVATION_LINKS = {
    "reservations_retrieve": "Get",
    "reservations_commit": "Commit",
    "reservations_release": "Release",
    "reservations_extend": "Extend",
    "reservations_uncertain": "MarkUncertain",
}


def add_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the links of a reservation's 201/200 answers."""
    reservation_ops = {"reservations_create": "201", "reservations_retrieve": "200"}
    for item in result.get("paths", {}).values():
        for operation in item.values():
            status = (
                reservation_ops.get(operation.get("operationId", ""))
                if isinstance(operation, dict)
                else None
            )
            response = operation.get("responses", {}).get(status) if status else None
            if response is None:
                continue
            links = {
                name: {
                    "operationId": target,
                    "parameters": {"reservation_id": "$response.body#/id"},
                }
                for target, name in RESERVATION_LINKS.items()
            }
            links["TenantStatus"] = {
                "operationId": "tenants_status",
                "parameters": {"external_id": "$response.body#/tenant"},
            }
            response["links"] = links
    return result


class DocsAccess(BasePermission):
    """``API_DOCS_ACCESS``: "public", "staff" (an active staff user of the host's session, as
    its admin logs in) or "off" (404, as if not mounted)."""

    message = (
        "The API docs are for staff: log in to the admin first (LLM_BUDGETS['API_DOCS_ACCESS'])."
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        access = conf.API_DOCS_ACCESS
        if access == "off":
            raise Http404
        if access == "public":
            return True
        user = request.user  # the host's session (SessionAuthentication), as its admin logs in
        return bool(user.is_active and getattr(user, "is_staff", False))


_SCHEMAS: dict[tuple[str, str | None, str], tuple[bytes, str, str]] = {}
"""Rendered schemas by (mount prefix, version, media type): the schema depends only on the code,
so each process builds and renders it once (about 50-300 ms, docs/performance.md), not per
request."""


class SchemaView(NoStore, SpectacularAPIView):
    """``GET schema/``: OpenAPI 3 (YAML; ``?format=json`` for JSON). No data, but the operator
    endpoints it describes are the host's business: ``DocsAccess`` decides who reads it."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [DocsAccess]
    custom_settings = SCHEMA_SETTINGS
    schema = AutoSchema()

    @api_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        from llm_budgets.api.routes import api_patterns

        # Only this API's endpoints, at the prefix the host mounted it on.
        route = request.resolver_match.route if request.resolver_match else SCHEMA_PATH
        prefix = route[: -len(SCHEMA_PATH)] if route.endswith(SCHEMA_PATH) else ""
        self.patterns = [path(prefix, include(api_patterns))]
        version = self.api_version or request.version or self._get_version_parameter(request)
        media_type = str(request.accepted_media_type)
        key = (prefix, version, media_type)
        if key not in _SCHEMAS:
            with own_schema():
                response = super().get(request, *args, **kwargs)
            renderer = request.accepted_renderer
            body = renderer.render(response.data, media_type, self.get_renderer_context())
            body = body.encode() if isinstance(body, str) else body
            charset = f"; charset={renderer.charset}" if renderer.charset else ""
            _SCHEMAS[key] = (body, media_type + charset, response["Content-Disposition"])
        body, content_type, disposition = _SCHEMAS[key]
        return HttpResponse(  # type: ignore[return-value]
            body, content_type=content_type, headers={"Content-Disposition": disposition}
        )


class SwaggerView(NoStore, SpectacularSwaggerView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [DocsAccess]
    url_name = "llm_budgets_api:schema"
    title = "llm_budgets API"
    schema = AutoSchema()

    @api_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return _get_sidecar_url(f"swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return _get_sidecar_url("swagger-ui-dist/favicon-32x32.png")
