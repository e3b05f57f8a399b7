"""Small host projects for the host matrix, generated into a directory: a ``startproject``-like
project that adds llm_budgets exactly as the README says, plus one host convention per case
(docs/adopting.md). Each host carries its own tiny test suite (``inside/test_host.py``) that uses
the kit (``llm_budgets.testing``) and is run by pytest inside the host, in a subprocess."""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

INSIDE = Path(__file__).with_name("inside")

# The README's additions, as a host pastes them ("add those you lack").
README_APPS = [
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "llm_budgets",
]
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


@dataclass
class Host:
    """One host convention. ``settings``: text appended to the settings module; ``files``: more
    files (path -> text); ``apps`` go before the README's apps, ``shared`` replaces INSTALLED_APPS
    construction for django-tenants."""

    name: str
    settings: str = ""
    apps: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    urls: str = ""  # extra url patterns (Python list items)
    database: str = ""  # a settings expression for DATABASES["default"]; default SQLite
    middleware_first: list[str] = field(default_factory=list)


def _sqlite() -> str:
    # The README's SQLite options: serialise admissions by taking the write lock at BEGIN.
    return (
        '{"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3", '
        '"OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 5}}'
    )


def settings_text(host: Host) -> str:
    apps = [*DJANGO_APPS, *host.apps, "shop", *README_APPS]
    middleware = [*host.middleware_first, *MIDDLEWARE]
    return textwrap.dedent(
        f"""\
        from pathlib import Path

        BASE_DIR = Path(__file__).resolve().parent.parent
        SECRET_KEY = "host-matrix-only-not-a-secret-{host.name}"
        DEBUG = False
        ALLOWED_HOSTS = ["testserver", "localhost", ".localhost"]
        INSTALLED_APPS = {apps!r}
        MIDDLEWARE = {middleware!r}
        ROOT_URLCONF = "hostproj.urls"
        TEMPLATES = [
            {{
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "DIRS": [BASE_DIR / "templates"],
                "APP_DIRS": True,
                "OPTIONS": {{
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ],
                }},
            }},
        ]
        DATABASES = {{"default": {host.database or _sqlite()}}}
        DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
        USE_TZ = True
        TIME_ZONE = "UTC"
        STATIC_URL = "static/"
        LOGIN_URL = "/accounts/login/"
        HOST_CASE = {host.name!r}
        LLM_BUDGETS = {{"DEFAULT_TTL_SECONDS": 120, "LOCK_TIMEOUT_SECONDS": 3}}
        """
    ) + textwrap.dedent(host.settings)


def urls_text(host: Host) -> str:
    return (
        textwrap.dedent(
            """\
        from django.contrib import admin
        from django.urls import include, path

        from shop import views

        urlpatterns = [
            path("admin/", admin.site.urls),
            path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
            path("usage/", include("llm_budgets.pages.urls")),
            path("accounts/", include("django.contrib.auth.urls")),
            path("chat/", views.chat, name="chat"),
        """
        )
        + textwrap.indent(textwrap.dedent(host.urls), "    ")
        + "]\n"
    )


# The host's own app: a guarded view streaming a completion to the signed-in user.
SHOP_VIEWS = """\
import openai
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponseBase

from llm_budgets.integrations.django import request_end_user, stream_response
from llm_budgets.integrations.openai import guard
from shop.tenancy import host_tenant


@login_required
def chat(request: HttpRequest) -> HttpResponseBase:
    client = guard(
        openai.OpenAI(max_retries=0),
        tenant=host_tenant(request),
        end_user=request_end_user(request),  # LLM_BUDGETS["END_USER_ID"], as the pages
    )
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": request.GET.get("q", "Hello")}],
        max_completion_tokens=200,
        stream=True,
    )
    return stream_response(stream)
"""

SHOP_TENANCY = '''\
from llm_budgets.pages.access import membership_tenant


def host_tenant(request):
    """The llm_budgets tenant of a request: the signed-in user's membership."""
    return membership_tenant(request)


def create_host_tenant(external_id, name):
    """The host has no tenants of its own: llm_budgets' tenant is the whole story."""
'''

LOGIN_TEMPLATE = """\
<form method="post">{% csrf_token %}{{ form.as_p }}<button>Log in</button></form>
"""


def write(root: Path, host: Host) -> Path:
    """Generate ``host`` under ``root`` (a new directory); returns the host's directory."""
    base = root / host.name
    files = {
        "manage.py": (
            "import os, sys\n"
            "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'hostproj.settings')\n"
            "from django.core.management import execute_from_command_line\n"
            "execute_from_command_line(sys.argv)\n"
        ),
        "hostproj/__init__.py": "",
        "hostproj/settings.py": settings_text(host),
        "hostproj/urls.py": urls_text(host),
        "shop/__init__.py": "",
        "shop/views.py": SHOP_VIEWS,
        "shop/tenancy.py": SHOP_TENANCY,
        "templates/registration/login.html": LOGIN_TEMPLATE,
        "pytest.ini": (
            "[pytest]\nDJANGO_SETTINGS_MODULE = hostproj.settings\n"
            "testpaths = tests\naddopts = -p no:randomly -p no:cacheprovider\n"
        ),
        "conftest.py": 'pytest_plugins = ["llm_budgets.testing.pytest"]\n',
        "tests/__init__.py": "",
        **host.files,
    }
    for relative, text in files.items():
        path = base / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in ("conftest.py", "test_host.py", f"test_{host.name}.py"):
        if (INSIDE / name).exists():
            shutil.copy(INSIDE / name, base / "tests" / name)
    return base
