"""A production settings example (docs/reliability.md, "Security posture"): the project's
settings with Django's deployment hardening on. ``manage.py check --deploy`` is clean with it
(tests/test_security.py runs it). Everything secret comes from the environment, never from here.

    DJANGO_SETTINGS_MODULE=project.production SECRET_KEY=... ALLOWED_HOSTS=budgets.example.com \\
        DATABASE_URL=postgres://... gunicorn project.wsgi
"""

from __future__ import annotations

import os

# Email goes out by SMTP in production (EMAIL_HOST / EMAIL_PORT), not to the console as in the
# demo: set before the project's settings read it (they build MAILERS from it on Django 6.1+).
os.environ.setdefault("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")

from project.settings import *  # noqa: F403
from project.settings import env

DEBUG = False
SECRET_KEY = env("SECRET_KEY")  # required: no default in production
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

# HTTPS only, behind a proxy that terminates TLS and sets X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SECURE_HSTS_SECONDS = 60 * 60 * 24 * 365
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# The REST API counts failed API-key attempts per source: with a proxy in front, tell DRF how
# many, so the client's address (not the proxy's) is the source.
REST_FRAMEWORK = {"NUM_PROXIES": env.int("NUM_PROXIES", default=1)}

# The API's schema and Swagger page for the host's staff only (the demo's are public).
LLM_BUDGETS = {**LLM_BUDGETS, "API_DOCS_ACCESS": "staff"}  # noqa: F405
