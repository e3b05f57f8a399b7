"""System checks for ``settings.LLM_BUDGETS`` and for the database's ability to lock rows."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections

from llm_budgets.billing import checks as billing_checks  # noqa: F401 (registers W070)
from llm_budgets.conf import DEFAULTS, SettingError, setting_read

# The check id of each key; the check itself is the key's reader in ``llm_budgets.conf``, the same
# code that gives the app the value.
CHECK_IDS: dict[str, str] = {
    "DEFAULT_TTL_SECONDS": "llm_budgets.E003",
    "LOCK_TIMEOUT_SECONDS": "llm_budgets.E004",
    "EXPIRED_HOLD_POLICY": "llm_budgets.E005",
    "CURRENCY": "llm_budgets.E006",
    "MAX_TOKENS_PER_CALL": "llm_budgets.E007",
    "MAX_TTL_SECONDS": "llm_budgets.E008",
    "API_THROTTLE_RATE": "llm_budgets.E009",
    "NEW_END_USERS_PER_DAY": "llm_budgets.E010",
    "NEW_RUNS_PER_DAY": "llm_budgets.E011",
    "API_AUTH_FAILURE_RATE": "llm_budgets.E090",
    "UNCERTAIN_SETTLE_RULE": "llm_budgets.E020",
    "UNCERTAIN_MAX_AGE_SECONDS": "llm_budgets.E021",
    "WARNING_THRESHOLDS": "llm_budgets.E022",
    "WARNING_DELIVERY": "llm_budgets.E023",
    "WARNING_CLAIM_TIMEOUT_SECONDS": "llm_budgets.E024",
    "WARNING_FROM_EMAIL": "llm_budgets.E025",
    "RETENTION_RELEASED_DAYS": "llm_budgets.E026",
    "ROLLUP_LOOKBACK_DAYS": "llm_budgets.E027",
    "RETENTION_REFUSALS_DAYS": "llm_budgets.E028",
    "TOKEN_ESTIMATE_SAFETY_MARGIN": "llm_budgets.E030",
    "OPERATOR_EMAILS": "llm_budgets.E040",
    "POOLER": "llm_budgets.E060",
    "HEALTH_SWEEP_MAX_LAG_SECONDS": "llm_budgets.E061",
    "READ_REPLICA": "llm_budgets.E062",
    "API_KEY_CACHE_SECONDS": "llm_budgets.E063",
    "TENANT_RESOLVER": "llm_budgets.E064",
    "STRIPE_API_KEY": "llm_budgets.E070",
    "STRIPE_API_BASE": "llm_budgets.E071",
    "STRIPE_METER_EVENT_NAME": "llm_budgets.E072",
    "STRIPE_WEBHOOK_SECRET": "llm_budgets.E073",
    "STRIPE_ON_PAYMENT_FAILED": "llm_budgets.E074",
    "STRIPE_MAX_ATTEMPTS": "llm_budgets.E075",
    "STRIPE_RETRY_BASE_SECONDS": "llm_budgets.E076",
    "STRIPE_RECONCILE_DAYS": "llm_budgets.E077",
}


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
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
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Error(
                f"LLM_BUDGETS has an unknown key {key!r}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="llm_budgets.E002",
            )
        )
    for key, check_id in sorted(CHECK_IDS.items(), key=lambda item: item[1]):
        try:
            setting_read(key)
        except SettingError as exc:
            errors.append(Error(exc.message, hint=exc.hint, id=check_id))
    return errors


@register(Tags.database)
def check_row_locking(**kwargs: Any) -> list[CheckMessage]:
    """Warn when admission cannot be serialised: no row locks and no write lock at BEGIN."""
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        connection = connections[alias]
        if connection.features.has_select_for_update:
            continue
        mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if connection.vendor == "sqlite" and str(mode).upper() == "IMMEDIATE":
            continue
        messages.append(
            Warning(
                f"Database {alias!r} ({connection.vendor}) cannot lock rows, so concurrent "
                "admissions may overspend a budget.",
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
    """The hot path (admission, settlement, their reads) runs on the ``default`` alias: refuse a
    router that sends the app's models to another database, where the holds, counters and
    ledger lines would be split from the locks that guard them."""
    from django.apps import apps
    from django.db import DEFAULT_DB_ALIAS, router

    messages: list[CheckMessage] = []
    for model in apps.get_app_config("llm_budgets").get_models():
        routed = {router.db_for_read(model), router.db_for_write(model)} - {DEFAULT_DB_ALIAS}
        if routed:
            messages.append(
                Error(
                    f"A database router sends {model._meta.label} to "
                    f"{', '.join(sorted(map(repr, routed)))}; llm_budgets runs on the "
                    f"{DEFAULT_DB_ALIAS!r} database only.",
                    hint="Make your routers return None (or 'default') for the llm_budgets app "
                    "(model._meta.app_label == 'llm_budgets'); see docs/settings.md.",
                    obj=model,
                    id="llm_budgets.E050",
                )
            )
    return messages


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
