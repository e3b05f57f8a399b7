"""The REST API (Django REST framework), mounted by the host with
``path("api/llm-budgets/v1/", include("llm_budgets.api.urls"))``.

Thin by design: serializers check shapes, views resolve what the API key may see and call the
services; HTTP status codes are decided only in :mod:`llm_budgets.api.exceptions`.
"""
