"""The app's settings: one dict, ``settings.LLM_BUDGETS``, read through a typed object.

Every access re-reads ``django.conf.settings`` so ``override_settings`` just works. Each key has
one reader (:data:`READERS`) that returns the typed value the code uses or raises
:class:`SettingError` saying what is wrong; the system checks in :mod:`llm_budgets.checks` call
the same readers, so they validate exactly what the code reads, and a bad value is never coerced
silently into another one. The readers are plain type and range tests: cheap on the admission
path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Seconds a hold lives before the sweep expires it (per call: ``reserve(ttl=...)``).
    "DEFAULT_TTL_SECONDS": 120,
    # How long admission waits for a counter lock before refusing with LedgerUnavailable.
    "LOCK_TIMEOUT_SECONDS": 3,
    # What the sweep does with an overdue hold: "charge" its amount as estimated spend
    # (a timeout is no proof the provider stopped), or "release" it.
    "EXPIRED_HOLD_POLICY": "charge",
    # A commit reporting usage its hold could not have produced (docs/limits.md, "Usage a hold
    # admits") is refused ("refuse", UsageExceedsHold). "record": such usage is charged anyway,
    # if it costs at most USAGE_BEYOND_HOLD_MAX_PERCENT more than the hold, as overage, with a
    # WARNING event and an audit row staff see (for hosts that cannot state a call's input).
    "USAGE_BEYOND_HOLD": "refuse",
    "USAGE_BEYOND_HOLD_MAX_PERCENT": 100,
    # Currency of prices and limits (ISO 4217). One currency per installation for now.
    "CURRENCY": "USD",
    # Token counts above this are refused as absurd (InvalidUsage), per field and per call.
    "MAX_TOKENS_PER_CALL": 10_000_000,
    # Longest TTL a caller may ask for, in seconds.
    "MAX_TTL_SECONDS": 24 * 60 * 60,
    # New end users and new runs a tenant's calls may bring in per 24 hours (created by admitted
    # calls only), or None for no cap: beyond it a call naming a new one is refused (NewIdCapped);
    # calls for ones seen before still run.
    "NEW_END_USERS_PER_DAY": 10_000,
    "NEW_RUNS_PER_DAY": 100_000,
    # Addresses emailed when a kill switch is tripped or cleared. Empty: no email.
    "OPERATOR_EMAILS": [],
    # Multiplier (>= 1) on the conservative token bound used for prompts of models that tiktoken
    # cannot count (see llm_budgets/pricing/tokens.py).
    "TOKEN_ESTIMATE_SAFETY_MARGIN": "1.10",
    # Billing modifiers a price does not list rates for (``Price.service_tiers``), priced as a
    # multiplier of the rates that apply, per provider: the providers' published figures
    # (docs/pricing.md, "Billing modifiers"). An operator may override or add a provider or a
    # modifier; a modifier in neither place is refused (UnknownPrice), never charged standard.
    "SERVICE_TIER_MULTIPLIERS": {
        "openai": {"priority": "2", "flex": "0.5"},
        "anthropic": {"fast": "6", "geo_us": "1.1"},
    },
    # Requests per API key for the REST API (DRF rate syntax "N/second|minute|hour|day"), or None
    # for no limit. Counted in Django's default cache: use a shared one with several processes.
    "API_THROTTLE_RATE": "600/minute",
    # Seconds each web process keeps an API key's row after reading it, so authenticating needs
    # no database read; 0: read it on every request. A key revoked or changed in another process
    # is seen within this long (in the same process at once).
    "API_KEY_CACHE_SECONDS": 0,
    # Failed API-key authentications per source address (``TRUSTED_PROXIES``) before that source
    # is refused with 429 until the window ends, or None for no limit; a known key that is
    # revoked or expired counts against itself instead, at the same rate. Counted in the
    # database, across processes.
    "API_AUTH_FAILURE_RATE": "20/minute",
    # How many reverse proxies in front of the app append to X-Forwarded-For. 0: none, the
    # source address is REMOTE_ADDR and X-Forwarded-For (client-controlled) is ignored; n: the
    # n-th entry from its right, the address the farthest of them saw.
    "TRUSTED_PROXIES": 0,
    # Jobs (docs/operations.md). An UNCERTAIN reservation (outcome unknown) older than
    # UNCERTAIN_MAX_AGE_SECONDS is settled by rule: "charge" its hold as estimated spend, or
    # "release" it.
    "UNCERTAIN_SETTLE_RULE": "charge",
    "UNCERTAIN_MAX_AGE_SECONDS": 60 * 60,
    # Warning emails: percentages of a budget (plan and budget may override), and whether a
    # crash between sending and recording re-sends ("at_least_once") or gives up ("at_most_once").
    "WARNING_THRESHOLDS": [50, 80, 100],
    "WARNING_DELIVERY": "at_least_once",
    # A claim to send older than this is taken to be a crashed sender.
    "WARNING_CLAIM_TIMEOUT_SECONDS": 10 * 60,
    # Sender address of warning emails; None: settings.DEFAULT_FROM_EMAIL.
    "WARNING_FROM_EMAIL": None,
    # Retention: released (never charged) reservations are deleted this many days after settling.
    # Ledger lines, and reservations that have any, are never deleted.
    "RETENTION_RELEASED_DAYS": 30,
    # Refusal records (why a call was refused) are deleted this many days after the refusal.
    "RETENTION_REFUSALS_DAYS": 90,
    # The daily rollup job rebuilds this many recent local days (late true-ups land in the past).
    "ROLLUP_LOOKBACK_DAYS": 3,
    # The connection pooler between the app and PostgreSQL, if any: None (none, or Django's own
    # pool), "session" or "transaction" (PgBouncer's pool modes). With "transaction" the checks
    # warn about settings that break under it (docs/scaling.md).
    "POOLER": None,
    # Alias in DATABASES of a read replica for reads that tolerate lag (pages, rollups, reports),
    # used inside llm_budgets.routers.replica_reads() with ReplicaRouter; None: the primary.
    "READ_REPLICA": None,
    # The connection the ledger's transactions run on (docs/operations.md, "The ledger's own
    # connection"): None, a second connection to the default database the app adds as
    # "llm_budgets_ledger"; an alias of DATABASES (the same database through a pooler, say); or
    # "default", to run them inside the caller's transaction (a host's rollback then erases
    # charges).
    "LEDGER_DATABASE": None,
    # Health endpoint (docs/operations.md): a hold overdue by more than this many seconds means
    # the expiry sweep is not keeping up, and the health check fails.
    "HEALTH_SWEEP_MAX_LAG_SECONDS": 300,
    # Who may read the API's own schema and Swagger page (docs/api.md): "staff" (active staff
    # users logged in to the host, e.g. through the admin), "public" (anyone) or "off" (404).
    "API_DOCS_ACCESS": "staff",
    # Whether the API's endpoints also appear in a schema the host generates (its own
    # drf-spectacular view or `manage.py spectacular`). Off: only the app's own schema has them.
    "API_DOCS_IN_HOST_SCHEMA": False,
    # Tenant pages (docs/pages.md): dotted path to a callable (request) -> tenant external id or
    # None (no access). The default reads the Membership model, managed in the admin.
    "TENANT_RESOLVER": "llm_budgets.pages.access.membership_tenant",
    # Who a host user is in the ledger (docs/pages.md, "Who an end user is"): dotted path to a
    # callable (user) -> end user external id, used by the pages (a member's own usage) and the
    # Django integration helper (what a guarded call records). The default, the primary key as a
    # string, puts no personal data (an email, a name) into ledger lines, exports and logs.
    "END_USER_ID": "llm_budgets.host_users.user_pk",
    # Headers a guarded SDK client may send beside the built-in list of headers that bill
    # nothing (docs/integrations.md, "Side doors"): a name ("x-my-trace"), a prefix ending in
    # "*" ("x-my-gateway-*"), or "name: value" for one value ("anthropic-beta: some-beta-1").
    "GUARD_FREE_HEADERS": [],
    # Stripe metered billing (docs/billing.md). Nothing is sent without an API key.
    "STRIPE_API_KEY": None,
    # Where the Stripe client sends requests; tests point it at a fake server on 127.0.0.1.
    "STRIPE_API_BASE": "https://api.stripe.com",
    # The meter's event name (a plan may have its own: StripePlanMeter).
    "STRIPE_METER_EVENT_NAME": "llm_usage",
    # Signing secret of the webhook endpoint (whsec_...). Without it every webhook is refused.
    "STRIPE_WEBHOOK_SECRET": None,
    # invoice.payment_failed for a linked customer: "ignore", or "trip" a tenant kill switch.
    "STRIPE_ON_PAYMENT_FAILED": "ignore",
    # Transient delivery failures (connection, 5xx, 429) retry with exponential backoff from
    # STRIPE_RETRY_BASE_SECONDS, up to STRIPE_MAX_ATTEMPTS attempts; then the row is parked.
    "STRIPE_MAX_ATTEMPTS": 8,
    "STRIPE_RETRY_BASE_SECONDS": 30,
    # Reconciliation compares this many past days of delivered hours with Stripe's summaries.
    "STRIPE_RECONCILE_DAYS": 3,
    # Self-serve (docs/pages.md, "Tenant admins act"): actions a host hides from tenant admins
    # on the pages and the API alike, from SELF_SERVE_ACTIONS ("budgets", "raises",
    # "reset_spend", "api_keys", "alerts"); which tenants may act at all is the plan's and the
    # tenant's self_serve switch (off by default).
    "SELF_SERVE_HIDDEN_ACTIONS": [],
    # API keys a tenant may hold (live: not revoked, not expired) for its admins to create more
    # themselves; each key has its own rate limit (API_THROTTLE_RATE), so this bounds a tenant's
    # total rate too. The operators may create more.
    "SELF_SERVE_MAX_API_KEYS": 10,
    # Prepaid top-up packages the tenant pages and API offer: {"name": "amount"}, e.g.
    # {"starter": "10", "team": "100"} (docs/billing.md, "Prepaid balances").
    "PREPAID_PACKAGES": {},
    # The most one top-up of a typed amount may pay (the tenant pages and the REST API), in the
    # installation's currency; None: no maximum. Packages are the operators' own.
    "PREPAID_TOP_UP_MAX": "10000",
    # Alerts (docs/alerts.md). Plain http:// endpoints: refused unless DEBUG or this is True
    # (local receivers, tests); True outside DEBUG is an error (check llm_budgets.E110).
    "ALERTS_ALLOW_HTTP": False,
    # Private, loopback, link-local and reserved addresses an endpoint may resolve to outside
    # DEBUG (IPs or networks, e.g. ["127.0.0.1"] in tests); every other such address is refused
    # (server-side request forgery).
    "ALERTS_ALLOWED_ADDRESSES": [],
    # Seconds one attempt may take (connect, send, the whole answer), and the most of the answer
    # read (the rest is not read).
    "ALERTS_TIMEOUT_SECONDS": 10,
    "ALERTS_MAX_RESPONSE_BYTES": 64 * 1024,
    # Retries: exponential from ALERTS_RETRY_BASE_SECONDS, each wait at most
    # ALERTS_RETRY_MAX_SECONDS, with jitter; a delivery still failing ALERTS_RETRY_HORIZON_SECONDS
    # after its first attempt is given up ("failed").
    "ALERTS_RETRY_BASE_SECONDS": 10,
    "ALERTS_RETRY_MAX_SECONDS": 60 * 60,
    "ALERTS_RETRY_HORIZON_SECONDS": 3 * 24 * 60 * 60,
    # An endpoint whose attempts failed this many times in a row is disabled, its owner emailed.
    "ALERTS_DISABLE_AFTER_FAILURES": 20,
    # How long the old secret stays valid after a rotation (both sign meanwhile), by default and
    # at most (a rotation asking more is refused).
    "ALERTS_SECRET_OVERLAP_SECONDS": 24 * 60 * 60,
    "ALERTS_SECRET_OVERLAP_MAX_SECONDS": 7 * 24 * 60 * 60,
    # How long the link that confirms an email address of a tenant's endpoint stays valid.
    "ALERTS_EMAIL_CONFIRM_SECONDS": 24 * 60 * 60,
}

EXPIRED_HOLD_POLICIES = ("charge", "release")
STRIPE_PAYMENT_FAILED_ACTIONS = ("ignore", "trip")
UNCERTAIN_SETTLE_RULES = ("charge", "release")
USAGE_BEYOND_HOLD_RULES = ("refuse", "record")
WARNING_DELIVERIES = ("at_least_once", "at_most_once")
POOLERS = (None, "session", "transaction")
API_DOCS_ACCESSES = ("staff", "public", "off")


class SettingError(ValueError):
    """A value of ``LLM_BUDGETS`` the app cannot use: ``message`` says what it must be, ``hint``
    what was given and what it is for."""

    def __init__(self, key: str, message: str, hint: str) -> None:
        self.key, self.message, self.hint = key, message, hint
        super().__init__(f"{message} {hint}")


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise SettingError(key, f"LLM_BUDGETS[{key!r}] must be a positive integer.", f"Got {value!r}.")


def _optional_cap(key: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a positive integer, or None for no cap.",
        f"Got {value!r}. It bounds how many new ids a tenant's calls bring in per 24 hours.",
    )


def _default_ttl(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['DEFAULT_TTL_SECONDS'] must be a positive integer (seconds).",
        f"Got {value!r}.",
    )


def _max_ttl(key: str, value: Any) -> int:
    default = _get("DEFAULT_TTL_SECONDS")
    valid_default = isinstance(default, int) and not isinstance(default, bool) and default > 0
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value > 0
        and not (valid_default and value < default)
    ):
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['MAX_TTL_SECONDS'] must be a positive integer no smaller than "
        "DEFAULT_TTL_SECONDS.",
        f"Got {value!r}.",
    )


def _lock_timeout(key: str, value: Any) -> Decimal:
    if not isinstance(value, bool) and isinstance(value, int | float | Decimal) and 0 < value <= 60:
        return Decimal(str(value))
    raise SettingError(
        key,
        "LLM_BUDGETS['LOCK_TIMEOUT_SECONDS'] must be a number of seconds in (0, 60].",
        f"Got {value!r}. Admission waits at most this long for a counter lock.",
    )


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def read(key: str, value: Any) -> str:
        if value in allowed:
            return str(value)
        raise SettingError(
            key,
            f"LLM_BUDGETS[{key!r}] must be one of {', '.join(map(repr, allowed))}.",
            f"Got {value!r}.",
        )

    return read


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise SettingError(key, f"LLM_BUDGETS[{key!r}] must be True or False.", f"Got {value!r}.")


def _currency(key: str, value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Z]{3}", value):
        return value
    raise SettingError(
        key, "LLM_BUDGETS['CURRENCY'] must be an ISO 4217 code such as 'USD'.", f"Got {value!r}."
    )


def email_address_valid(value: object) -> bool:
    """The one test of an email address setting: ``addr@example.com`` or
    ``Name <addr@example.com>`` (as ``send_mail`` takes them)."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    if not isinstance(value, str):
        return False
    try:
        validate_email(value.rpartition("<")[2].rstrip(">").strip())
    except ValidationError:
        return False
    return True


def _email_list(key: str, value: Any) -> list[str]:
    if isinstance(value, list | tuple) and all(email_address_valid(e) for e in value):
        return list(value)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a list of email addresses.",
        f"Got {value!r}. They are emailed when a kill switch trips or clears.",
    )


def _optional_email(key: str, value: Any) -> str | None:
    if value is None or email_address_valid(value):
        return None if value is None else str(value)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be None or an email address.",
        f"Got {value!r}; None sends from settings.DEFAULT_FROM_EMAIL.",
    )


def _thresholds(key: str, value: Any) -> list[int]:
    if (
        isinstance(value, list)
        and all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 100 for p in value)
        and len(set(value)) == len(value)
    ):
        return list(value)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a list of distinct whole percentages from 1 to 100 "
        "([] for no warnings).",
        f"Got {value!r}; e.g. [50, 80, 100].",
    )


def _safety_margin(key: str, value: Any) -> Decimal:
    try:
        margin = None if isinstance(value, bool | float) else Decimal(str(value))
    except (ArithmeticError, InvalidOperation):
        margin = None
    if margin is not None and margin.is_finite() and 1 <= margin <= 10:
        return margin
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a number from 1 to 10 (a Decimal, int or numeric string).",
        f"Got {value!r}. It multiplies the conservative token bound; see docs/pricing.md.",
    )


def _multiplier(figure: Any) -> Decimal | None:
    """A positive, finite Decimal from an int or a numeric string (never a float, whose binary
    value is not the figure written), else None."""
    try:
        number = None if isinstance(figure, bool | float) else Decimal(str(figure))
    except (ArithmeticError, InvalidOperation):
        return None
    return number if number is not None and number.is_finite() and number > 0 else None


def _multiplier_row(provider: Any, modifiers: Any) -> dict[str, Decimal] | None:
    """One provider's ``{modifier: multiplier}``, or None if any part is unusable (a modifier
    name has no ``+``: it joins several)."""
    if not isinstance(provider, str) or not isinstance(modifiers, dict):
        return None
    row = {}
    for name, figure in modifiers.items():
        number = _multiplier(figure)
        if not isinstance(name, str) or not name or "+" in name or number is None:
            return None
        row[name] = number
    return row


def _multipliers(key: str, value: Any) -> dict[str, dict[str, Decimal]]:
    """``{provider: {modifier: multiplier}}``."""
    rows = [_multiplier_row(*item) for item in value.items()] if isinstance(value, dict) else [None]
    if None not in rows:
        return dict(zip(value, rows, strict=True))
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must map providers to {{modifier: multiplier}}, each multiplier "
        'a positive int or numeric string, e.g. {"openai": {"priority": "2", "flex": "0.5"}}.',
        f"Got {value!r}. Modifier names have no '+' (it joins several); see docs/pricing.md.",
    )


def _throttle_rate(key: str, value: Any) -> str | None:
    if value is None or (
        isinstance(value, str) and re.fullmatch(r"[1-9][0-9]*/(s|m|h|d)[a-z]*", value)
    ):
        return None if value is None else str(value)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be None or a rate such as '600/minute'.",
        f"Got {value!r}. Units: second, minute, hour, day.",
    )


def _pooler(key: str, value: Any) -> str | None:
    if value in POOLERS:
        return None if value is None else str(value)
    raise SettingError(
        key,
        "LLM_BUDGETS['POOLER'] must be None, 'session' or 'transaction'.",
        f"Got {value!r}: the pool mode of the PgBouncer (or other pooler) between the app and "
        "PostgreSQL; None when there is none.",
    )


def _read_replica(key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value in settings.DATABASES):
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['READ_REPLICA'] must be None or an alias in DATABASES.",
        f"Got {value!r}; aliases: {', '.join(sorted(settings.DATABASES))}.",
    )


def _ledger_database(key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value in settings.DATABASES):
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['LEDGER_DATABASE'] must be None or an alias in DATABASES.",
        f"Got {value!r}; aliases: {', '.join(sorted(settings.DATABASES))}. None: the app's own "
        "second connection to the default database.",
    )


def _api_key_cache_seconds(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 300:
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['API_KEY_CACHE_SECONDS'] must be a whole number of seconds from 0 to 300.",
        f"Got {value!r}. A revoked key may be accepted by other processes for this long; 0 "
        "reads the key on every request.",
    )


def _trusted_proxies(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 16:
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['TRUSTED_PROXIES'] must be a whole number from 0 to 16.",
        f"Got {value!r}: how many proxies in front of the app append to X-Forwarded-For "
        "(0: none; the header is then ignored, since a client can forge it).",
    )


def _dotted_callable(key: str, value: Any) -> str:
    """A dotted path to a callable, e.g. ``TENANT_RESOLVER``; the path is returned."""
    from django.utils.module_loading import import_string

    example = DEFAULTS[key]
    hint = f"Got {value!r}; e.g. {example!r} (see docs/pages.md)."
    try:
        found = import_string(value) if isinstance(value, str) else None
    except ImportError as exc:
        raise SettingError(key, f"LLM_BUDGETS[{key!r}] cannot be imported ({exc}).", hint) from None
    if not callable(found):
        raise SettingError(key, f"LLM_BUDGETS[{key!r}] must be a dotted path to a callable.", hint)
    return str(value)


def _stripe_key(key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and re.fullmatch(r"(sk|rk)_\w+", value)):
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['STRIPE_API_KEY'] must be None or a Stripe secret or restricted key "
        "(sk_... or rk_...).",
        "Got a value of another shape; nothing is sent to Stripe without a key.",
    )


def _stripe_base(key: str, value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", value):
        return value.rstrip("/")
    raise SettingError(
        key,
        "LLM_BUDGETS['STRIPE_API_BASE'] must be a base URL such as 'https://api.stripe.com'.",
        f"Got {value!r}.",
    )


def _meter_event_name(key: str, value: Any) -> str:
    if isinstance(value, str) and 0 < len(value) <= 100 and value.strip() == value:
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['STRIPE_METER_EVENT_NAME'] must be a non-empty string of at most 100 "
        "characters (Stripe's limit), without surrounding spaces.",
        f"Got {value!r}.",
    )


def _webhook_secret(key: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.startswith("whsec_")):
        return value
    raise SettingError(
        key,
        "LLM_BUDGETS['STRIPE_WEBHOOK_SECRET'] must be None or the endpoint's signing secret "
        "(whsec_...).",
        "Copy it from the webhook endpoint in Stripe's dashboard.",
    )


# What a tenant admin may do from the pages and a self-serve key (control/self_serve.py).
SELF_SERVE_ACTIONS = ("budgets", "raises", "reset_spend", "api_keys", "alerts")


def _self_serve_actions(key: str, value: Any) -> list[str]:
    if isinstance(value, list | tuple) and all(v in SELF_SERVE_ACTIONS for v in value):
        return list(value)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a list of actions from: {', '.join(SELF_SERVE_ACTIONS)}.",
        f"Got {value!r}.",
    )


def _packages(key: str, value: Any) -> dict[str, Decimal]:
    packages: dict[str, Decimal] = {}
    if isinstance(value, dict):
        for name, amount in value.items():
            try:
                number = Decimal(amount) if isinstance(amount, str | int) else None
            except InvalidOperation:
                number = None
            if not isinstance(name, str) or not name or number is None or not number > 0:
                break
            packages[name] = number
        else:
            return packages
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a dict of package names to positive amounts as strings, "
        'e.g. {"starter": "10"}.',
        f"Got {value!r}.",
    )


def _overlap(key: str, value: Any) -> int:
    """ALERTS_SECRET_OVERLAP_SECONDS: a positive integer, no more than the maximum."""
    most = _get("ALERTS_SECRET_OVERLAP_MAX_SECONDS")
    valid_most = isinstance(most, int) and not isinstance(most, bool) and most > 0
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value > 0
        and not (valid_most and value > most)
    ):
        return value
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a positive integer no larger than "
        "ALERTS_SECRET_OVERLAP_MAX_SECONDS.",
        f"Got {value!r}.",
    )


def _optional_amount(key: str, value: Any) -> Decimal | None:
    if value is None:
        return None
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) and Decimal(text) > 0:
        return Decimal(text)
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a positive amount as a plain decimal string (e.g. "
        '"10000"), or None.',
        f"Got {value!r}. It is the most one top-up may pay; None: no maximum.",
    )


def _address_list(key: str, value: Any) -> list[str]:
    import ipaddress

    try:
        if isinstance(value, list | tuple):
            return [str(ipaddress.ip_network(str(v), strict=False)) for v in value]
    except ValueError:
        pass
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a list of IP addresses or networks.",
        f"Got {value!r}. Alert endpoints may resolve to these private addresses (tests: "
        "['127.0.0.1']).",
    )


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _free_headers(key: str, value: Any) -> list[str]:
    """Header names (``*`` at the end: a prefix) or ``name: value`` pairs, lower-cased."""
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        entries = [v.strip().lower() for v in value]
        if all(_HEADER_NAME.fullmatch(e.split(":", 1)[0].strip()) for e in entries):
            return entries
    raise SettingError(
        key,
        f"LLM_BUDGETS[{key!r}] must be a list of header names, prefixes ending in '*', or "
        "'name: value' pairs.",
        f"Got {value!r}. Example: ['x-my-trace-id', 'x-my-gateway-*', 'anthropic-beta: "
        "some-beta-1'].",
    )


# Each key's reader: the typed value the code uses, or SettingError.
READERS: dict[str, Callable[[str, Any], Any]] = {
    "DEFAULT_TTL_SECONDS": _default_ttl,
    "LOCK_TIMEOUT_SECONDS": _lock_timeout,
    "EXPIRED_HOLD_POLICY": _choice(*EXPIRED_HOLD_POLICIES),
    "USAGE_BEYOND_HOLD": _choice(*USAGE_BEYOND_HOLD_RULES),
    "USAGE_BEYOND_HOLD_MAX_PERCENT": _positive_int,
    "CURRENCY": _currency,
    "MAX_TOKENS_PER_CALL": _positive_int,
    "MAX_TTL_SECONDS": _max_ttl,
    "NEW_END_USERS_PER_DAY": _optional_cap,
    "NEW_RUNS_PER_DAY": _optional_cap,
    "OPERATOR_EMAILS": _email_list,
    "TOKEN_ESTIMATE_SAFETY_MARGIN": _safety_margin,
    "SERVICE_TIER_MULTIPLIERS": _multipliers,
    "API_THROTTLE_RATE": _throttle_rate,
    "API_AUTH_FAILURE_RATE": _throttle_rate,
    "UNCERTAIN_SETTLE_RULE": _choice(*UNCERTAIN_SETTLE_RULES),
    "UNCERTAIN_MAX_AGE_SECONDS": _positive_int,
    "WARNING_THRESHOLDS": _thresholds,
    "WARNING_DELIVERY": _choice(*WARNING_DELIVERIES),
    "WARNING_CLAIM_TIMEOUT_SECONDS": _positive_int,
    "WARNING_FROM_EMAIL": _optional_email,
    "RETENTION_RELEASED_DAYS": _positive_int,
    "RETENTION_REFUSALS_DAYS": _positive_int,
    "ROLLUP_LOOKBACK_DAYS": _positive_int,
    "POOLER": _pooler,
    "READ_REPLICA": _read_replica,
    "LEDGER_DATABASE": _ledger_database,
    "HEALTH_SWEEP_MAX_LAG_SECONDS": _positive_int,
    "API_KEY_CACHE_SECONDS": _api_key_cache_seconds,
    "TRUSTED_PROXIES": _trusted_proxies,
    "TENANT_RESOLVER": _dotted_callable,
    "API_DOCS_ACCESS": _choice(*API_DOCS_ACCESSES),
    "API_DOCS_IN_HOST_SCHEMA": _bool,
    "END_USER_ID": _dotted_callable,
    "GUARD_FREE_HEADERS": _free_headers,
    "STRIPE_API_KEY": _stripe_key,
    "STRIPE_API_BASE": _stripe_base,
    "STRIPE_METER_EVENT_NAME": _meter_event_name,
    "STRIPE_WEBHOOK_SECRET": _webhook_secret,
    "STRIPE_ON_PAYMENT_FAILED": _choice(*STRIPE_PAYMENT_FAILED_ACTIONS),
    "STRIPE_MAX_ATTEMPTS": _positive_int,
    "STRIPE_RETRY_BASE_SECONDS": _positive_int,
    "STRIPE_RECONCILE_DAYS": _positive_int,
    "SELF_SERVE_HIDDEN_ACTIONS": _self_serve_actions,
    "SELF_SERVE_MAX_API_KEYS": _positive_int,
    "PREPAID_PACKAGES": _packages,
    "PREPAID_TOP_UP_MAX": _optional_amount,
    "ALERTS_ALLOW_HTTP": _bool,
    "ALERTS_ALLOWED_ADDRESSES": _address_list,
    "ALERTS_TIMEOUT_SECONDS": _positive_int,
    "ALERTS_MAX_RESPONSE_BYTES": _positive_int,
    "ALERTS_RETRY_BASE_SECONDS": _positive_int,
    "ALERTS_RETRY_MAX_SECONDS": _positive_int,
    "ALERTS_RETRY_HORIZON_SECONDS": _positive_int,
    "ALERTS_DISABLE_AFTER_FAILURES": _positive_int,
    "ALERTS_SECRET_OVERLAP_SECONDS": _overlap,
    "ALERTS_SECRET_OVERLAP_MAX_SECONDS": _positive_int,
    "ALERTS_EMAIL_CONFIRM_SECONDS": _positive_int,
}


def _get(key: str) -> Any:
    user = getattr(settings, "LLM_BUDGETS", None) or {}
    return user.get(key, DEFAULTS[key]) if isinstance(user, dict) else DEFAULTS[key]


def setting_read(key: str) -> Any:
    """The typed value of ``LLM_BUDGETS[key]`` (or its default); ``SettingError`` if unusable."""
    return READERS[key](key, _get(key))


# Values read and checked, by key: a call reads about twenty, and Django's settings are fixed
# once loaded, except where Django says they changed (``override_settings`` in tests).
_read: dict[str, Any] = {}


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting in ("LLM_BUDGETS", "DATABASES"):  # the ledger's and replica's aliases check both
        _read.clear()


def settings_watch() -> None:
    """Connect the receiver that forgets the values read when Django says a setting changed
    (``override_settings``; ``AppConfig.ready``)."""
    setting_changed.connect(_forget)


class Settings:
    """Shadow of ``settings.LLM_BUDGETS`` with defaults filled in, each value typed and checked
    by its reader."""

    def _get(self, key: str) -> Any:
        try:
            return _read[key]
        except KeyError:
            pass
        reader = READERS.get(key)
        value = _get(key) if reader is None else reader(key, _get(key))
        _read[key] = value
        return value

    @property
    def DEFAULT_TTL_SECONDS(self) -> int:
        return int(self._get("DEFAULT_TTL_SECONDS"))

    @property
    def LOCK_TIMEOUT_SECONDS(self) -> Decimal:
        return Decimal(self._get("LOCK_TIMEOUT_SECONDS"))

    @property
    def EXPIRED_HOLD_POLICY(self) -> str:
        return str(self._get("EXPIRED_HOLD_POLICY"))

    @property
    def USAGE_BEYOND_HOLD(self) -> str:
        return str(self._get("USAGE_BEYOND_HOLD"))

    @property
    def USAGE_BEYOND_HOLD_MAX_PERCENT(self) -> int:
        return int(self._get("USAGE_BEYOND_HOLD_MAX_PERCENT"))

    @property
    def CURRENCY(self) -> str:
        return str(self._get("CURRENCY"))

    @property
    def MAX_TOKENS_PER_CALL(self) -> int:
        return int(self._get("MAX_TOKENS_PER_CALL"))

    @property
    def MAX_TTL_SECONDS(self) -> int:
        return int(self._get("MAX_TTL_SECONDS"))

    @property
    def OPERATOR_EMAILS(self) -> list[str]:
        return list(self._get("OPERATOR_EMAILS"))

    @property
    def UNCERTAIN_SETTLE_RULE(self) -> str:
        return str(self._get("UNCERTAIN_SETTLE_RULE"))

    @property
    def UNCERTAIN_MAX_AGE_SECONDS(self) -> int:
        return int(self._get("UNCERTAIN_MAX_AGE_SECONDS"))

    @property
    def WARNING_THRESHOLDS(self) -> list[int]:
        return [int(p) for p in self._get("WARNING_THRESHOLDS")]

    @property
    def WARNING_DELIVERY(self) -> str:
        return str(self._get("WARNING_DELIVERY"))

    @property
    def WARNING_CLAIM_TIMEOUT_SECONDS(self) -> int:
        return int(self._get("WARNING_CLAIM_TIMEOUT_SECONDS"))

    @property
    def WARNING_FROM_EMAIL(self) -> str:
        value = self._get("WARNING_FROM_EMAIL")
        return str(value) if value else str(settings.DEFAULT_FROM_EMAIL)

    @property
    def RETENTION_RELEASED_DAYS(self) -> int:
        return int(self._get("RETENTION_RELEASED_DAYS"))

    @property
    def NEW_END_USERS_PER_DAY(self) -> int | None:
        value: int | None = self._get("NEW_END_USERS_PER_DAY")
        return value

    @property
    def NEW_RUNS_PER_DAY(self) -> int | None:
        value: int | None = self._get("NEW_RUNS_PER_DAY")
        return value

    @property
    def RETENTION_REFUSALS_DAYS(self) -> int:
        return int(self._get("RETENTION_REFUSALS_DAYS"))

    @property
    def ROLLUP_LOOKBACK_DAYS(self) -> int:
        return int(self._get("ROLLUP_LOOKBACK_DAYS"))

    @property
    def API_KEY_CACHE_SECONDS(self) -> int:
        return int(self._get("API_KEY_CACHE_SECONDS"))

    @property
    def TRUSTED_PROXIES(self) -> int:
        return int(self._get("TRUSTED_PROXIES"))

    @property
    def POOLER(self) -> str | None:
        value = self._get("POOLER")
        return None if value is None else str(value)

    @property
    def READ_REPLICA(self) -> str | None:
        value = self._get("READ_REPLICA")
        return None if value is None else str(value)

    @property
    def LEDGER_DATABASE(self) -> str | None:
        value = self._get("LEDGER_DATABASE")
        return None if value is None else str(value)

    @property
    def HEALTH_SWEEP_MAX_LAG_SECONDS(self) -> int:
        return int(self._get("HEALTH_SWEEP_MAX_LAG_SECONDS"))

    @property
    def TENANT_RESOLVER(self) -> str:
        return str(self._get("TENANT_RESOLVER"))

    @property
    def API_DOCS_ACCESS(self) -> str:
        return str(self._get("API_DOCS_ACCESS"))

    @property
    def API_DOCS_IN_HOST_SCHEMA(self) -> bool:
        return bool(self._get("API_DOCS_IN_HOST_SCHEMA"))

    @property
    def END_USER_ID(self) -> str:
        return str(self._get("END_USER_ID"))

    @property
    def TOKEN_ESTIMATE_SAFETY_MARGIN(self) -> Decimal:
        return Decimal(self._get("TOKEN_ESTIMATE_SAFETY_MARGIN"))

    @property
    def SERVICE_TIER_MULTIPLIERS(self) -> dict[str, dict[str, Decimal]]:
        return dict(self._get("SERVICE_TIER_MULTIPLIERS"))

    @property
    def API_THROTTLE_RATE(self) -> str | None:
        rate = self._get("API_THROTTLE_RATE")
        return None if rate is None else str(rate)

    @property
    def GUARD_FREE_HEADERS(self) -> list[str]:
        return list(self._get("GUARD_FREE_HEADERS"))

    @property
    def STRIPE_API_KEY(self) -> str | None:
        return self._get("STRIPE_API_KEY")  # type: ignore[no-any-return]

    @property
    def STRIPE_API_BASE(self) -> str:
        return str(self._get("STRIPE_API_BASE"))

    @property
    def STRIPE_METER_EVENT_NAME(self) -> str:
        return str(self._get("STRIPE_METER_EVENT_NAME"))

    @property
    def PREPAID_PACKAGES(self) -> dict[str, Decimal]:
        return dict(self._get("PREPAID_PACKAGES"))

    @property
    def STRIPE_WEBHOOK_SECRET(self) -> str | None:
        return self._get("STRIPE_WEBHOOK_SECRET")  # type: ignore[no-any-return]

    @property
    def STRIPE_ON_PAYMENT_FAILED(self) -> str:
        return str(self._get("STRIPE_ON_PAYMENT_FAILED"))

    @property
    def STRIPE_MAX_ATTEMPTS(self) -> int:
        return int(self._get("STRIPE_MAX_ATTEMPTS"))

    @property
    def STRIPE_RETRY_BASE_SECONDS(self) -> int:
        return int(self._get("STRIPE_RETRY_BASE_SECONDS"))

    @property
    def STRIPE_RECONCILE_DAYS(self) -> int:
        return int(self._get("STRIPE_RECONCILE_DAYS"))

    @property
    def API_AUTH_FAILURE_RATE(self) -> str | None:
        rate = self._get("API_AUTH_FAILURE_RATE")
        return None if rate is None else str(rate)

    @property
    def SELF_SERVE_HIDDEN_ACTIONS(self) -> list[str]:
        return self._get("SELF_SERVE_HIDDEN_ACTIONS")  # type: ignore[no-any-return]

    @property
    def SELF_SERVE_MAX_API_KEYS(self) -> int:
        return int(self._get("SELF_SERVE_MAX_API_KEYS"))

    @property
    def PREPAID_TOP_UP_MAX(self) -> Decimal | None:
        value = self._get("PREPAID_TOP_UP_MAX")
        return None if value is None else Decimal(value)

    @property
    def ALERTS_ALLOW_HTTP(self) -> bool:
        return bool(self._get("ALERTS_ALLOW_HTTP"))

    @property
    def ALERTS_ALLOWED_ADDRESSES(self) -> list[str]:
        return list(self._get("ALERTS_ALLOWED_ADDRESSES"))

    @property
    def ALERTS_TIMEOUT_SECONDS(self) -> int:
        return int(self._get("ALERTS_TIMEOUT_SECONDS"))

    @property
    def ALERTS_MAX_RESPONSE_BYTES(self) -> int:
        return int(self._get("ALERTS_MAX_RESPONSE_BYTES"))

    @property
    def ALERTS_RETRY_BASE_SECONDS(self) -> int:
        return int(self._get("ALERTS_RETRY_BASE_SECONDS"))

    @property
    def ALERTS_RETRY_MAX_SECONDS(self) -> int:
        return int(self._get("ALERTS_RETRY_MAX_SECONDS"))

    @property
    def ALERTS_RETRY_HORIZON_SECONDS(self) -> int:
        return int(self._get("ALERTS_RETRY_HORIZON_SECONDS"))

    @property
    def ALERTS_DISABLE_AFTER_FAILURES(self) -> int:
        return int(self._get("ALERTS_DISABLE_AFTER_FAILURES"))

    @property
    def ALERTS_SECRET_OVERLAP_SECONDS(self) -> int:
        return int(self._get("ALERTS_SECRET_OVERLAP_SECONDS"))

    @property
    def ALERTS_SECRET_OVERLAP_MAX_SECONDS(self) -> int:
        return int(self._get("ALERTS_SECRET_OVERLAP_MAX_SECONDS"))

    @property
    def ALERTS_EMAIL_CONFIRM_SECONDS(self) -> int:
        return int(self._get("ALERTS_EMAIL_CONFIRM_SECONDS"))


conf = Settings()
