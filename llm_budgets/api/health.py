"""``GET health``: 200 when this installation can admit calls, 503 naming the failing checks
(:mod:`llm_budgets.health`). No API key, no throttle, nothing tenant-specific."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from llm_budgets.api.schema import AppAutoSchema, api_schema
from llm_budgets.api.views import NoStore
from llm_budgets.health import health_check


class HealthCheckSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    detail = serializers.CharField()
    values = serializers.DictField(child=serializers.FloatField(), help_text="Measured numbers.")


class HealthSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "failing"])
    failing = serializers.ListField(
        child=serializers.CharField(), help_text="Names of the failing checks."
    )
    checks = serializers.DictField(
        child=HealthCheckSerializer(), help_text="database, migrations, sweep, jobs."
    )


class HealthView(NoStore, APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []
    renderer_classes = [JSONRenderer]
    schema = AppAutoSchema()

    @api_schema(
        operation_id="health_retrieve",
        summary="Health: database, migrations, expiry sweep, jobs (no API key)",
        auth=[],
        responses={
            200: HealthSerializer,
            503: OpenApiResponse(
                HealthSerializer, description="A check fails; `failing` names it."
            ),
        },
    )
    def get(self, request: Request) -> Response:
        report = health_check()
        body = {
            "status": "ok" if report.ok else "failing",
            "failing": report.failing,
            "checks": {
                c.name: {"ok": c.ok, "detail": c.detail, "values": c.values} for c in report.checks
            },
        }
        return Response(body, status=200 if report.ok else 503)
