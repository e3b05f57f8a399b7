"""System checks for ``settings.LLM_BUDGETS`` and for the database's ability to lock rows."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from llm_budgets.conf import CHECK_IDS, SETTINGS, SettingError, setting_read
from llm_budgets.schedule import jobs_expected, jobs_installed


def setting_or(key: str, fallback: Any) -> Any:
    """A setting's value for another check, or ``fallback`` when it is unusable (its own check,
    in ``check_settings``, reports that): one bad setting must not crash every check."""
    try:
        return setting_read(key)
    except SettingError:
        return fallback


def reads_default_database(databases: list[str] | None) -> bool:
    """Whether a check may read the app's (default) database: in plain ``check`` (None) when it
    answers, and under ``--database`` only when that names it."""
    return databases is None or DEFAULT_DB_ALIAS in databases


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Every key of ``LLM_BUDGETS`` is declared (``llm_budgets.conf.SETTINGS``: this app's keys
    and those of any app whose conf module is imported), and each declared key's value passes its
    reader, reported under the check id of its declaration."""
    user = getattr(settings, "LLM_BUDGETS", {})
    if not isinstance(user, dict):
        return [
            Error(
                "LLM_BUDGETS must be a dict.",
                hint=f"Got {type(user).__name__}; see docs/settings.md.",
                id="llm_budgets.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for key in sorted(set(user) - set(SETTINGS)):
        errors.append(
            Error(
                f"LLM_BUDGETS has an unknown key {key!r}.",
                hint=f"Known keys: {', '.join(sorted(SETTINGS))}.",
                id="llm_budgets.E002",
            )
        )
    for key, check_id in sorted(CHECK_IDS.items(), key=lambda item: item[1]):
        try:
            setting_read(key)
        except SettingError as exc:
            errors.append(Error(exc.message, hint=exc.hint, id=check_id))
    return errors


@register(Tags.compatibility)
def check_row_locking(**kwargs: Any) -> list[CheckMessage]:
    """Warn when admission cannot be serialised: no row locks and no write lock at BEGIN. Read
    from the settings (no connection is opened), so plain ``manage.py check`` shows it, not
    only ``check --database`` or ``migrate``; without ``--database`` the app's own alias."""
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or [DEFAULT_DB_ALIAS]:
        connection = connections[alias]
        if connection.features.has_select_for_update:
            continue
        mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if connection.vendor == "sqlite" and str(mode).upper() == "IMMEDIATE":
            continue
        if connection.vendor == "sqlite":
            # The ledger's own transactions BEGIN IMMEDIATE whatever the setting
            # (boundary.ledger_transaction); every other write still begins deferred.
            message = (
                f"Database {alias!r} (sqlite) does not take its write lock at BEGIN: "
                "llm_budgets' admissions and settlements do it themselves, but other writes "
                "(budgets, tenants, the admin's, the host's) can fail with 'database is locked' "
                "under concurrency instead of waiting their turn."
            )
        else:
            message = (
                f"Database {alias!r} ({connection.vendor}) cannot lock rows, so concurrent "
                "admissions may overspend a budget."
            )
        messages.append(
            Warning(
                message,
                hint=(
                    "Use PostgreSQL in production. On SQLite set "
                    "OPTIONS={'transaction_mode': 'IMMEDIATE', 'timeout': 5}."
                ),
                id="llm_budgets.W001",
            )
        )
    return messages


@register(Tags.models)
def check_database_routing(**kwargs: Any) -> list[CheckMessage]:
    """The hot path (admission, settlement, their reads) runs on the ``default`` database, the
    ledger's writes on its own connection to it (``LEDGER_DATABASE``): refuse a router that sends
    the app's models to any other alias, where the holds, counters and ledger lines would be
    split from the locks that guard them."""
    from django.apps import apps
    from django.db import DEFAULT_DB_ALIAS, router

    from llm_budgets.db.ledger import LEDGER_ALIAS

    allowed = {DEFAULT_DB_ALIAS, LEDGER_ALIAS, setting_or("LEDGER_DATABASE", None)}
    messages: list[CheckMessage] = []
    for model in apps.get_app_config("llm_budgets").get_models():
        routed = {router.db_for_read(model), router.db_for_write(model)} - allowed - {None}
        if routed:
            messages.append(
                Error(
                    f"A database router sends {model._meta.label} to "
                    f"{', '.join(sorted(map(repr, routed)))}; llm_budgets runs on the "
                    f"{DEFAULT_DB_ALIAS!r} database only (its ledger on "
                    "LLM_BUDGETS['LEDGER_DATABASE'], a route to the same database).",
                    hint="Make your routers return None (or 'default') for the llm_budgets app "
                    "(model._meta.app_label == 'llm_budgets'), or name the alias they route to in "
                    "LLM_BUDGETS['LEDGER_DATABASE']; see docs/settings.md.",
                    obj=model,
                    id="llm_budgets.E050",
                )
            )
    return messages


@register(Tags.compatibility)
def check_sqlite_atomic_requests(**kwargs: Any) -> list[CheckMessage]:
    """SQLite has one writer, so the ledger cannot have a connection of its own there: it joins
    the caller's transaction, and a request that ``ATOMIC_REQUESTS`` rolls back takes its charges
    with it (docs/operations.md, "The ledger's own connection")."""
    default = settings.DATABASES.get("default") or {}
    if "sqlite" not in str(default.get("ENGINE", "")) or not default.get("ATOMIC_REQUESTS"):
        return []
    return [
        Warning(
            "ATOMIC_REQUESTS is on with SQLite: llm_budgets' ledger joins each request's "
            "transaction there (SQLite has one writer), so a view that raises after a provider "
            "call rolls its charge back with the request.",
            hint="Use PostgreSQL in production, where the ledger commits on its own connection; "
            "on SQLite mark views that call providers @transaction.non_atomic_requests.",
            id="llm_budgets.W051",
        )
    ]


@register(Tags.database)
def check_transaction_pooling(**kwargs: Any) -> list[CheckMessage]:
    """With ``POOLER="transaction"`` a server connection is shared between clients transaction by
    transaction: prepared statements, server-side bindings and cursors held open across
    transactions break (PgBouncer before 1.21 has no prepared-statement support)."""
    user = getattr(settings, "LLM_BUDGETS", None)
    if not isinstance(user, dict) or user.get("POOLER") != "transaction":
        return []
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        db = connections[alias].settings_dict
        if connections[alias].vendor != "postgresql":
            continue
        options = db.get("OPTIONS") or {}
        if options.get("prepare_threshold") is not None:
            messages.append(
                Warning(
                    f"Database {alias!r} sets OPTIONS['prepare_threshold'] while "
                    "LLM_BUDGETS['POOLER'] is 'transaction'.",
                    hint="Prepared statements live on one server connection, which a transaction "
                    "pooler hands to other clients: remove prepare_threshold (Django's default "
                    "is None), unless the pooler supports them (PgBouncer >= 1.21 with "
                    "max_prepared_statements).",
                    id="llm_budgets.W060",
                )
            )
        if options.get("server_side_binding") is True:
            messages.append(
                Warning(
                    f"Database {alias!r} sets OPTIONS['server_side_binding'] while "
                    "LLM_BUDGETS['POOLER'] is 'transaction'.",
                    hint="Server-side binding prepares statements; remove it behind a "
                    "transaction pooler.",
                    id="llm_budgets.W061",
                )
            )
        if not db.get("DISABLE_SERVER_SIDE_CURSORS"):
            messages.append(
                Warning(
                    f"Database {alias!r} keeps server-side cursors while "
                    "LLM_BUDGETS['POOLER'] is 'transaction'.",
                    hint="Set DISABLE_SERVER_SIDE_CURSORS=True for it: a cursor of "
                    "QuerySet.iterator() outlives its transaction's server connection.",
                    id="llm_budgets.W062",
                )
            )
    return messages


@register(Tags.compatibility)
def check_replica_router(**kwargs: Any) -> list[CheckMessage]:
    """``READ_REPLICA`` does nothing without ``ReplicaRouter`` in ``DATABASE_ROUTERS``."""
    user = getattr(settings, "LLM_BUDGETS", None)
    if not isinstance(user, dict) or user.get("READ_REPLICA") is None:
        return []
    if "llm_budgets.routers.ReplicaRouter" in getattr(settings, "DATABASE_ROUTERS", []):
        return []
    return [
        Warning(
            "LLM_BUDGETS['READ_REPLICA'] is set but ReplicaRouter is not in DATABASE_ROUTERS.",
            hint="Add 'llm_budgets.routers.ReplicaRouter' to DATABASE_ROUTERS, or no read goes "
            "to the replica.",
            id="llm_budgets.W063",
        )
    ]


DATABASE_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"


def _beat_uses_database() -> bool:
    scheduler = getattr(settings, "CELERY_BEAT_SCHEDULER", None)
    name = scheduler if isinstance(scheduler, str) else getattr(scheduler, "__qualname__", "")
    return "DatabaseScheduler" in str(name)


def beat_schedule_tasks() -> set[str]:
    """llm_budgets' tasks in the host's ``CELERY_BEAT_SCHEDULE`` setting."""
    schedule = getattr(settings, "CELERY_BEAT_SCHEDULE", None) or {}
    entries = schedule.values() if isinstance(schedule, dict) else []
    return {str(e.get("task")) for e in entries if isinstance(e, dict)} & _tasks()


def _tasks() -> set[str]:
    return {job.task for job in jobs_installed()}


def _expected_tasks() -> set[str]:
    return {job.task for job in jobs_expected(stripe=bool(setting_or("STRIPE_API_KEY", None)))}


@register(Tags.compatibility)
def check_schedule(**kwargs: Any) -> list[CheckMessage]:
    """One way to schedule the jobs per scheduler (docs/operations.md, "Wiring the schedule"):
    warn when the ready dict is merged under django-celery-beat's DatabaseScheduler (which
    rewrites its rows from it at every beat start), or when Celery is configured and no job is
    scheduled. Reads the Django settings of Celery's ``CELERY`` namespace; the rows of a
    DatabaseScheduler are read from the default database when it answers."""
    merged = beat_schedule_tasks()
    if _beat_uses_database():
        if merged:
            return [
                Warning(
                    "llm_budgets' jobs are in CELERY_BEAT_SCHEDULE while beat uses "
                    "django-celery-beat's DatabaseScheduler, which rewrites their periodic tasks "
                    "from CELERY_BEAT_SCHEDULE at every beat start (admin edits are reverted, "
                    "the expiries llm_budgets_install_schedule sets are lost).",
                    hint="Remove llm_budgets.schedule.BEAT_SCHEDULE from CELERY_BEAT_SCHEDULE and "
                    "run manage.py llm_budgets_install_schedule once (docs/operations.md).",
                    id="llm_budgets.W080",
                )
            ]
        return _periodic_tasks_missing(kwargs.get("databases"))
    celery = any(
        hasattr(settings, name)
        for name in ("CELERY_BROKER_URL", "CELERY_BEAT_SCHEDULER", "CELERY_BEAT_SCHEDULE")
    )
    missing = sorted(_expected_tasks() - merged)
    if not celery or not missing:
        return []
    return [
        Warning(
            f"Celery is configured but CELERY_BEAT_SCHEDULE lacks llm_budgets' job(s) "
            f"{', '.join(missing)}: overdue holds stay reserved and warnings are not sent.",
            hint="Merge llm_budgets.schedule.BEAT_SCHEDULE into CELERY_BEAT_SCHEDULE; with "
            "django-celery-beat set CELERY_BEAT_SCHEDULER to its DatabaseScheduler and run "
            "manage.py llm_budgets_install_schedule; with cron, run the llm_budgets_* commands "
            "and silence llm_budgets.W081 (docs/operations.md).",
            id="llm_budgets.W081",
        )
    ]


def _periodic_tasks_missing(databases: list[str] | None) -> list[CheckMessage]:
    from django.apps import apps

    if not apps.is_installed("django_celery_beat"):
        return [
            Warning(
                "CELERY_BEAT_SCHEDULER is django-celery-beat's DatabaseScheduler but "
                "django_celery_beat is not in INSTALLED_APPS.",
                hint="Add 'django_celery_beat' to INSTALLED_APPS, migrate, and run manage.py "
                "llm_budgets_install_schedule.",
                id="llm_budgets.W083",
            )
        ]
    from django_celery_beat.models import PeriodicTask

    if not reads_default_database(databases):
        return []
    try:
        installed = set(
            PeriodicTask.objects.filter(task__in=_tasks(), enabled=True).values_list(
                "task", flat=True
            )
        )
    except DatabaseError:
        return []  # not migrated yet, or no database here: /health names jobs that never run
    missing = sorted(_expected_tasks() - installed)
    if not missing:
        return []
    return [
        Warning(
            f"Beat uses django-celery-beat's DatabaseScheduler and no enabled periodic task runs "
            f"llm_budgets' job(s) {', '.join(missing)}.",
            hint="Run manage.py llm_budgets_install_schedule (it leaves existing rows alone), "
            "or enable the rows in the admin (Periodic tasks).",
            id="llm_budgets.W082",
        )
    ]


@register(Tags.compatibility)
def check_api_key_app(**kwargs: Any) -> list[CheckMessage]:
    """The REST API's keys are djangorestframework-api-key's model: without its app Django would
    not even load that model, so the app's models start on a stand-in base
    (``models/api_key_base.py``) and this says what to add."""
    from django.apps import apps

    if apps.is_installed("rest_framework_api_key"):
        return []
    return [
        Error(
            "'rest_framework_api_key' is not in INSTALLED_APPS: llm_budgets' API keys are built "
            "on djangorestframework-api-key, so no key can be created or checked without it.",
            hint="Add 'rest_framework_api_key' to INSTALLED_APPS (beside 'rest_framework'), then "
            "run manage.py migrate. Its own APIKey table stays unused: llm_budgets' keys are "
            "ApiKey, in the admin's LLM budgets section.",
            id="llm_budgets.E092",
        )
    ]


@register(Tags.compatibility)
def check_docs_apps(**kwargs: Any) -> list[CheckMessage]:
    """The API's schema and Swagger page need drf-spectacular and its sidecar installed as apps:
    without the first they are a 500, without the second a blank page."""
    from django.apps import apps

    if setting_or("API_DOCS_ACCESS", "staff") == "off":
        return []
    messages: list[CheckMessage] = []
    if not apps.is_installed("drf_spectacular"):
        messages.append(
            Error(
                "'drf_spectacular' is not in INSTALLED_APPS: the API's schema and Swagger page "
                "answer 500.",
                hint="Add 'drf_spectacular' (and 'drf_spectacular_sidecar') to INSTALLED_APPS, "
                "or set LLM_BUDGETS['API_DOCS_ACCESS'] = 'off'.",
                id="llm_budgets.E068",
            )
        )
    if not apps.is_installed("drf_spectacular_sidecar"):
        messages.append(
            Warning(
                "'drf_spectacular_sidecar' is not in INSTALLED_APPS: the API's Swagger page is "
                "blank (its assets are served from that package, never a CDN).",
                hint="Add 'drf_spectacular_sidecar' to INSTALLED_APPS (with "
                "django.contrib.staticfiles), or set LLM_BUDGETS['API_DOCS_ACCESS'] = 'off'.",
                id="llm_budgets.W069",
            )
        )
    return messages


@register(Tags.security)
def check_forwarded_for(**kwargs: Any) -> list[CheckMessage]:
    """DRF's ``NUM_PROXIES`` no longer picks the address llm_budgets throttles by: a host that set
    it for that must say so in ``TRUSTED_PROXIES``, or every client shares the proxy's address."""
    drf = getattr(settings, "REST_FRAMEWORK", None)
    if not isinstance(drf, dict) or drf.get("NUM_PROXIES") is None:
        return []
    user = getattr(settings, "LLM_BUDGETS", None)
    if isinstance(user, dict) and "TRUSTED_PROXIES" in user:
        return []
    return [
        Warning(
            "REST_FRAMEWORK['NUM_PROXIES'] is set but LLM_BUDGETS['TRUSTED_PROXIES'] is not: the "
            "API's failed-attempt throttle counts by REMOTE_ADDR, the nearest proxy's address.",
            hint="Set LLM_BUDGETS['TRUSTED_PROXIES'] to the number of proxies in front of the "
            "app that append to X-Forwarded-For (0 to keep REMOTE_ADDR); see docs/settings.md.",
            id="llm_budgets.W091",
        )
    ]
