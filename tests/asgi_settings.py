"""Settings of the uvicorn process of the ASGI tests: ``tests/server_settings.py`` with the
async views of ``tests/asgi_views.py``."""

from __future__ import annotations

from tests.server_settings import *  # noqa: F403

ROOT_URLCONF = "tests.asgi_views"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
