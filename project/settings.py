"""Settings for the llm_budgets demo and development project.

Everything that differs between machines comes from the environment (django-environ):
``DATABASE_URL`` (default: a SQLite file under ``var/``), ``CONN_MAX_AGE`` (seconds a database
connection is kept; default 0, a new one per request), ``SECRET_KEY``, ``DEBUG``,
``CELERY_BROKER_URL``, ``ALLOWED_HOSTS``.
"""

from __future__ import annotations

from pathlib import Path

import django
import environ

from llm_budgets.schedule import BEAT_SCHEDULE

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost"]),
)

SECRET_KEY = env("SECRET_KEY", default="dev-only-insecure-key-change-me-in-production")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "llm_budgets",
    "demo",  # the demonstration behind `make demo` (not part of the app)
]
try:  # the admin-editable beat schedule (demo, docker-compose); optional like Celery itself
    import django_celery_beat  # noqa: F401

    INSTALLED_APPS.append("django_celery_beat")
    HAS_CELERY_BEAT_DB = True
except ImportError:  # pragma: no cover - e.g. Django 6.1, which django-celery-beat 2.9 refuses
    HAS_CELERY_BEAT_DB = False

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
# Connecting to PostgreSQL costs more than a whole API request (docs/performance.md): keep the
# connection for CONN_MAX_AGE seconds, checked before reuse (docs/operations.md).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite has no row locks; admission is serialised by taking the database write lock at
    # BEGIN (IMMEDIATE) and waiting a bounded time for it (seconds) instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 5}
    )
    # A file, not :memory:, so tests with real threads and processes share one database; named
    # after the main file so two checkouts or runs with different DATABASE_URLs never collide.
    _db_file = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(_db_file.with_name(f"test_{_db_file.name}"))}

# A read replica for reads that tolerate lag (docs/scaling.md): REPLICA_DATABASE_URL, else the
# primary itself under a second alias. In tests it mirrors the test database.
DATABASES["replica"] = {
    **env.db(
        "REPLICA_DATABASE_URL",
        default=env("DATABASE_URL", default=None) or f"sqlite:///{VAR_DIR / 'db.sqlite3'}",
    ),
    "OPTIONS": dict(DATABASES["default"].get("OPTIONS", {})),
    "TEST": {"MIRROR": "default"},
}
DATABASE_ROUTERS = ["llm_budgets.routers.ReplicaRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The tenant usage pages (/usage/) send anonymous visitors to the login page, then back.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/usage/"
STATIC_ROOT = VAR_DIR / "static"

_email_backend = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
# SMTP (EMAIL_HOST/EMAIL_PORT) or the file backend (EMAIL_FILE_PATH, visible across processes).
_email_options = {
    "host": env("EMAIL_HOST", default="localhost"),
    "port": env.int("EMAIL_PORT", default=25),
    "timeout": 30,  # well below WARNING_CLAIM_TIMEOUT_SECONDS: a stuck send is not re-claimed
    "file_path": env("EMAIL_FILE_PATH", default=str(VAR_DIR / "mail")),
}
if django.VERSION >= (6, 1):  # EMAIL_BACKEND is deprecated there in favour of MAILERS.
    _wanted = {"smtp": ("host", "port", "timeout"), "filebased": ("file_path",)}
    _kind = next((k for k in _wanted if f".{k}." in _email_backend), "")
    MAILERS = {
        "default": {
            "BACKEND": _email_backend,
            "OPTIONS": {key: _email_options[key] for key in _wanted.get(_kind, ())},
        }
    }
else:
    EMAIL_BACKEND = _email_backend
    EMAIL_HOST = _email_options["host"]
    EMAIL_PORT = _email_options["port"]
    EMAIL_TIMEOUT = _email_options["timeout"]
    EMAIL_FILE_PATH = _email_options["file_path"]
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="budgets@localhost")

# Celery (project/celery.py). The demo runs tasks eagerly in-process; docker-compose sets a Redis
# broker and CELERY_TASK_ALWAYS_EAGER=false, and runs a worker and beat. With django-celery-beat
# the schedule lives in the database, editable in the admin (`manage.py
# llm_budgets_install_schedule` writes the defaults); without it, beat reads the ready dict.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_TASK_DEFAULT_QUEUE", default="celery")
if HAS_CELERY_BEAT_DB:
    CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
else:  # pragma: no cover
    CELERY_BEAT_SCHEDULE = BEAT_SCHEDULE
CELERY_TIMEZONE = TIME_ZONE
# A worker keeps reconnecting to the broker however long it is away (Celery's default gives up
# after 100 attempts, about 45 minutes), and survives the loss of a connection that held an
# unacknowledged message (llm_budgets/celery_worker.py; docs/reliability.md, "Bugs the suite
# found").
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CONSUMER = "llm_budgets.celery_worker:Consumer"
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # The llm_budgets tasks acknowledge late (llm_budgets/tasks.py): with Redis, the task of a
    # worker killed mid-run is delivered again once this many seconds have passed since it was
    # taken (Redis's own default is an hour). Keep it longer than the longest job runs.
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    # A connection whose peer went silent (a partition, a NAT or failover that forgets it) is
    # never closed by TCP in useful time: without a socket timeout a command on it (an ack, a
    # publish, the worker's periodic upkeep) waits forever, the worker's event loop with it.
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    # kombu drops a BRPOP whose reply is this much overdue (BRPOP itself waits 1 s), and pings
    # idle connections before use: a silent consumer connection is replaced within ~21 s.
    "health_check_interval": 10,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "llm_budgets": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")}
    },
}

# The app's own settings: one dict, every key validated by a system check (llm_budgets.E0xx).
LLM_BUDGETS = {
    "DEFAULT_TTL_SECONDS": 120,
    "LOCK_TIMEOUT_SECONDS": 3,
    "EXPIRED_HOLD_POLICY": "charge",
    "CURRENCY": "USD",
    # Stripe metered billing (docs/billing.md): nothing is sent without a key.
    "STRIPE_API_KEY": env("STRIPE_API_KEY", default=None),
    "STRIPE_API_BASE": env("STRIPE_API_BASE", default="https://api.stripe.com"),
    "STRIPE_WEBHOOK_SECRET": env("STRIPE_WEBHOOK_SECRET", default=None),
    # The demo's Swagger page and API clients read the schema without logging in; a host's
    # default is "staff" (docs/api.md).
    "API_DOCS_ACCESS": env("LLMB_API_DOCS_ACCESS", default="public"),
}

# drf-spectacular, for `manage.py spectacular` (the API's own schema view sets its title itself).
SPECTACULAR_SETTINGS = {
    "TITLE": "llm_budgets API",
    "SERVE_INCLUDE_SCHEMA": False,
}
