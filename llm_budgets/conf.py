"""The app's settings: one dict, ``settings.LLM_BUDGETS``, read through a typed object.

Each key is declared once, as a :class:`Setting` class attribute of :class:`Settings`: its name
(the attribute's), default, reader, system check id and a line saying what it does. Everything
else is derived from those declarations: the typed attribute (``conf.DEFAULT_TTL_SECONDS`` is an
``int`` for mypy too), :data:`DEFAULTS`, :data:`READERS` and :data:`CHECK_IDS`, the per-key
checks and the unknown-key check (:mod:`llm_budgets.checks`), and the test that holds
docs/settings.md to them.

A reader returns the typed value the code uses or raises :class:`SettingError` saying what is
wrong; the system checks call the same readers, so they validate exactly what the code reads, and
a bad value is never coerced silently into another one. The readers are plain type and range
tests: cheap on the admission path. Values are read once and kept until Django signals that
``LLM_BUDGETS`` (or ``DATABASES``) changed, so ``override_settings`` just works.

Another app (the contrib apps to come: ``llm_budgets.contrib.stripe``, ``.alerts``, ``.pages``)
declares its own keys the same way in its own conf module, read from the same ``LLM_BUDGETS``
dict::

    class StripeSettings:
        STRIPE_MAX_ATTEMPTS = Setting(default=8, read=..., check="llm_budgets.E075", doc="...")

    conf = StripeSettings()

Declaring a key registers it in :data:`SETTINGS`, the one registry every check reads, so the
unknown-key check (``llm_budgets.E002``) knows it and its own check runs, once the module is
imported (an app's checks module imports its conf module); a key declared twice is an error at
import. Every key is still declared here for now.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from copy import copy
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, TypeVar, cast, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

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

    example = SETTINGS[key].default
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


T = TypeVar("T")
V = TypeVar("V")


class Setting(Generic[T]):
    """One key of ``LLM_BUDGETS``, declared as a class attribute (its name is the key): the
    default, the reader that types and checks a value, the id of the system check that runs that
    reader, and one line saying what the key does. On an instance it reads as the typed value (a
    list or dict as a shallow copy: a caller cannot add to or drop from the value kept); on the
    class, the declaration itself."""

    def __init__(
        self, *, default: Any, read: Callable[[str, Any], T], check: str, doc: str
    ) -> None:
        self.default, self.read, self.check, self.doc = default, read, check, doc
        self.key = ""
        # A list or dict (every such key's default is one) is read as a shallow copy.
        self.copied = isinstance(default, list | dict)

    def __set_name__(self, owner: type, name: str) -> None:
        if name in SETTINGS:
            raise ImproperlyConfigured(f"LLM_BUDGETS[{name!r}] is declared twice.")
        self.key = name
        SETTINGS[name] = self

    def value(self) -> T:
        """The typed value, read and checked once, then kept until Django signals a change."""
        try:
            return cast(T, _read[self.key])
        except KeyError:
            pass
        value = _read[self.key] = self.read(self.key, _get(self.key))
        return value

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object, owner: type | None = None) -> Setting[T] | T:
        if instance is None:
            return self
        try:  # the kept value, without a call: settings are read on the admission path
            value = cast(T, _read[self.key])
        except KeyError:
            value = self.value()
        return copy(value) if self.copied else value


class _OrDefaultFromEmail(Setting[str | None]):
    """An address whose ``None`` reads as Django's ``settings.DEFAULT_FROM_EMAIL``, looked up at
    every access (it is Django's setting, not one of ours)."""

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> _OrDefaultFromEmail: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> str: ...

    def __get__(self, instance: object, owner: type | None = None) -> _OrDefaultFromEmail | str:
        if instance is None:
            return self
        return self.value() or str(settings.DEFAULT_FROM_EMAIL)


# Every key declared so far, by name, in the order declared: this module's, and those of any app
# whose conf module has been imported.
SETTINGS: dict[str, Setting[Any]] = {}


class _Column(Mapping[str, V]):
    """One part of every declaration, by key: a live view of :data:`SETTINGS`."""

    def __init__(self, part: Callable[[Setting[Any]], V]) -> None:
        self._part = part

    def __getitem__(self, key: str) -> V:
        return self._part(SETTINGS[key])

    def __iter__(self) -> Iterator[str]:
        return iter(SETTINGS)

    def __len__(self) -> int:
        return len(SETTINGS)


DEFAULTS: Mapping[str, Any] = _Column(lambda setting: setting.default)
READERS: Mapping[str, Callable[[str, Any], Any]] = _Column(lambda setting: setting.read)
CHECK_IDS: Mapping[str, str] = _Column(lambda setting: setting.check)


def _get(key: str) -> Any:
    default = SETTINGS[key].default
    user = getattr(settings, "LLM_BUDGETS", None) or {}
    return user.get(key, default) if isinstance(user, dict) else default


def setting_read(key: str) -> Any:
    """The typed value of ``LLM_BUDGETS[key]`` (or its default); ``SettingError`` if unusable."""
    return SETTINGS[key].read(key, _get(key))


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
    by its reader. docs/settings.md has a row for every key (a test holds it to these)."""

    DEFAULT_TTL_SECONDS = Setting(
        default=120,
        read=_default_ttl,
        check="llm_budgets.E003",
        doc="Seconds a hold lives before the sweep expires it (per call: ``reserve(ttl=...)``).",
    )
    LOCK_TIMEOUT_SECONDS = Setting(
        default=3,
        read=_lock_timeout,
        check="llm_budgets.E004",
        doc="How long admission waits for a counter lock before refusing (LedgerUnavailable).",
    )
    EXPIRED_HOLD_POLICY = Setting(
        default="charge",
        read=_choice(*EXPIRED_HOLD_POLICIES),
        check="llm_budgets.E005",
        doc="What the sweep does with an overdue hold: 'charge' its amount as estimated spend "
        "(a timeout is no proof the provider stopped), or 'release' it.",
    )
    USAGE_BEYOND_HOLD = Setting(
        default="refuse",
        read=_choice(*USAGE_BEYOND_HOLD_RULES),
        check="llm_budgets.E010",
        doc="A commit reporting usage its hold could not have produced is refused ('refuse', "
        "UsageExceedsHold), or charged as overage with a warning and an audit row ('record').",
    )
    USAGE_BEYOND_HOLD_MAX_PERCENT = Setting(
        default=100,
        read=_positive_int,
        check="llm_budgets.E011",
        doc="With USAGE_BEYOND_HOLD='record': how far above its hold, in percent, a commit may "
        "cost.",
    )
    CURRENCY = Setting(
        default="USD",
        read=_currency,
        check="llm_budgets.E006",
        doc="Currency of prices and limits (ISO 4217); one per installation.",
    )
    MAX_TOKENS_PER_CALL = Setting(
        default=10_000_000,
        read=_positive_int,
        check="llm_budgets.E007",
        doc="Token counts above this are refused as absurd (InvalidUsage), per field and call.",
    )
    MAX_TTL_SECONDS = Setting(
        default=24 * 60 * 60,
        read=_max_ttl,
        check="llm_budgets.E008",
        doc="Longest TTL a caller may ask for, in seconds; not below DEFAULT_TTL_SECONDS.",
    )
    NEW_END_USERS_PER_DAY = Setting(
        default=10_000,
        read=_optional_cap,
        check="llm_budgets.E012",
        doc="New end users a tenant's admitted calls may bring in per 24 hours, or None: past "
        "it a call naming a new one is refused (NewIdCapped).",
    )
    NEW_RUNS_PER_DAY = Setting(
        default=100_000,
        read=_optional_cap,
        check="llm_budgets.E013",
        doc="New runs a tenant's admitted calls may bring in per 24 hours, or None.",
    )
    OPERATOR_EMAILS = Setting(
        default=[],
        read=_email_list,
        check="llm_budgets.E040",
        doc="Addresses emailed when a kill switch is tripped or cleared; empty: no email.",
    )
    TOKEN_ESTIMATE_SAFETY_MARGIN = Setting(
        default="1.10",
        read=_safety_margin,
        check="llm_budgets.E030",
        doc="Multiplier (1 to 10) on the conservative token bound for prompts of models that "
        "tiktoken cannot count (llm_budgets/pricing/tokens.py).",
    )
    SERVICE_TIER_MULTIPLIERS = Setting(
        default={
            "openai": {"priority": "2", "flex": "0.5"},
            "anthropic": {"fast": "6", "geo_us": "1.1"},
        },
        read=_multipliers,
        check="llm_budgets.E031",
        doc="Billing modifiers a price lists no rates for, as multipliers of the rates that "
        "apply, per provider (docs/pricing.md); a modifier in neither is refused (UnknownPrice).",
    )
    API_THROTTLE_RATE = Setting(
        default="600/minute",
        read=_throttle_rate,
        check="llm_budgets.E009",
        doc="Requests per API key for the REST API ('N/second|minute|hour|day'), or None.",
    )
    API_KEY_CACHE_SECONDS = Setting(
        default=0,
        read=_api_key_cache_seconds,
        check="llm_budgets.E063",
        doc="Seconds each web process keeps an API key's row after reading it (0: read it on "
        "every request); another process sees a revocation within this long.",
    )
    API_AUTH_FAILURE_RATE = Setting(
        default="20/minute",
        read=_throttle_rate,
        check="llm_budgets.E090",
        doc="Failed API-key authentications per source address (or per known revoked or expired "
        "key) before it is refused with 429 until the window ends, or None.",
    )
    TRUSTED_PROXIES = Setting(
        default=0,
        read=_trusted_proxies,
        check="llm_budgets.E091",
        doc="How many reverse proxies in front of the app append to X-Forwarded-For (0: none, "
        "the header is ignored and the source address is REMOTE_ADDR).",
    )
    UNCERTAIN_SETTLE_RULE = Setting(
        default="charge",
        read=_choice(*UNCERTAIN_SETTLE_RULES),
        check="llm_budgets.E020",
        doc="How an UNCERTAIN reservation older than UNCERTAIN_MAX_AGE_SECONDS is settled: "
        "'charge' its hold as estimated spend, or 'release' it.",
    )
    UNCERTAIN_MAX_AGE_SECONDS = Setting(
        default=60 * 60,
        read=_positive_int,
        check="llm_budgets.E021",
        doc="How long an UNCERTAIN reservation waits for real usage before the rule applies.",
    )
    WARNING_THRESHOLDS = Setting(
        default=[50, 80, 100],
        read=_thresholds,
        check="llm_budgets.E022",
        doc="Percentages of a budget that send a warning email (a plan or budget may override).",
    )
    WARNING_DELIVERY = Setting(
        default="at_least_once",
        read=_choice(*WARNING_DELIVERIES),
        check="llm_budgets.E023",
        doc="Whether a crash between sending a warning and recording it re-sends "
        "('at_least_once') or gives up ('at_most_once').",
    )
    WARNING_CLAIM_TIMEOUT_SECONDS = Setting(
        default=10 * 60,
        read=_positive_int,
        check="llm_budgets.E024",
        doc="A claim to send a warning older than this is taken to be a crashed sender.",
    )
    WARNING_FROM_EMAIL = _OrDefaultFromEmail(
        default=None,
        read=_optional_email,
        check="llm_budgets.E025",
        doc="Sender address of warning emails; None: settings.DEFAULT_FROM_EMAIL.",
    )
    RETENTION_RELEASED_DAYS = Setting(
        default=30,
        read=_positive_int,
        check="llm_budgets.E026",
        doc="Released (never charged) reservations are deleted this many days after settling; "
        "ledger lines, and reservations that have any, never are.",
    )
    RETENTION_REFUSALS_DAYS = Setting(
        default=90,
        read=_positive_int,
        check="llm_budgets.E028",
        doc="Refusal records are deleted this many days after the refusal.",
    )
    ROLLUP_LOOKBACK_DAYS = Setting(
        default=3,
        read=_positive_int,
        check="llm_budgets.E027",
        doc="How many recent local days the daily rollup job rebuilds (late true-ups land in "
        "the past).",
    )
    POOLER = Setting(
        default=None,
        read=_pooler,
        check="llm_budgets.E060",
        doc="The pooler between the app and PostgreSQL: None, 'session' or 'transaction' "
        "(PgBouncer's modes; the checks then warn about what breaks under it).",
    )
    READ_REPLICA = Setting(
        default=None,
        read=_read_replica,
        check="llm_budgets.E062",
        doc="Alias in DATABASES of a read replica for reads that tolerate lag, used inside "
        "replica_reads() with ReplicaRouter; None: the primary.",
    )
    LEDGER_DATABASE = Setting(
        default=None,
        read=_ledger_database,
        check="llm_budgets.E051",
        doc="The connection the ledger's transactions run on: None, the app's own second "
        "connection to the default database; an alias of DATABASES; or 'default', the caller's.",
    )
    HEALTH_SWEEP_MAX_LAG_SECONDS = Setting(
        default=300,
        read=_positive_int,
        check="llm_budgets.E061",
        doc="The health check fails when a hold is overdue by more than this many seconds.",
    )
    API_DOCS_ACCESS = Setting(
        default="staff",
        read=_choice(*API_DOCS_ACCESSES),
        check="llm_budgets.E066",
        doc="Who may read the API's own schema and Swagger page: 'staff', 'public' or 'off'.",
    )
    API_DOCS_IN_HOST_SCHEMA = Setting(
        default=False,
        read=_bool,
        check="llm_budgets.E067",
        doc="Whether the API's endpoints also appear in a schema the host generates.",
    )
    TENANT_RESOLVER = Setting(
        default="llm_budgets.pages.access.membership_tenant",
        read=_dotted_callable,
        check="llm_budgets.E064",
        doc="Tenant pages: dotted path to a callable (request) -> tenant external id or None.",
    )
    END_USER_ID = Setting(
        default="llm_budgets.host_users.user_pk",
        read=_dotted_callable,
        check="llm_budgets.E065",
        doc="Who a host user is in the ledger: dotted path to a callable (user) -> end user "
        "external id; the default, the primary key, puts no personal data in the ledger.",
    )
    GUARD_FREE_HEADERS = Setting(
        default=[],
        read=_free_headers,
        check="llm_budgets.E140",
        doc="Headers a guarded SDK client may send beside the built-in ones that bill nothing: "
        "a name, a prefix ending in '*', or 'name: value'.",
    )
    STRIPE_API_KEY = Setting(
        default=None,
        read=_stripe_key,
        check="llm_budgets.E070",
        doc="Stripe metered billing (docs/billing.md): nothing is sent without an API key.",
    )
    STRIPE_API_BASE = Setting(
        default="https://api.stripe.com",
        read=_stripe_base,
        check="llm_budgets.E071",
        doc="Where the Stripe client sends requests; tests point it at a fake server.",
    )
    STRIPE_METER_EVENT_NAME = Setting(
        default="llm_usage",
        read=_meter_event_name,
        check="llm_budgets.E072",
        doc="The meter's event name (a plan may have its own: StripePlanMeter).",
    )
    STRIPE_WEBHOOK_SECRET = Setting(
        default=None,
        read=_webhook_secret,
        check="llm_budgets.E073",
        doc="Signing secret of the webhook endpoint (whsec_...); without it every webhook is "
        "refused.",
    )
    STRIPE_ON_PAYMENT_FAILED = Setting(
        default="ignore",
        read=_choice(*STRIPE_PAYMENT_FAILED_ACTIONS),
        check="llm_budgets.E074",
        doc="invoice.payment_failed for a linked customer: 'ignore', or 'trip' a tenant kill "
        "switch.",
    )
    STRIPE_MAX_ATTEMPTS = Setting(
        default=8,
        read=_positive_int,
        check="llm_budgets.E075",
        doc="Attempts of a delivery failing transiently (connection, 5xx, 429) before it is "
        "parked.",
    )
    STRIPE_RETRY_BASE_SECONDS = Setting(
        default=30,
        read=_positive_int,
        check="llm_budgets.E076",
        doc="Base of the exponential backoff between those attempts.",
    )
    STRIPE_RECONCILE_DAYS = Setting(
        default=3,
        read=_positive_int,
        check="llm_budgets.E077",
        doc="Past days of delivered hours the reconciliation compares with Stripe's summaries.",
    )
    SELF_SERVE_HIDDEN_ACTIONS = Setting(
        default=[],
        read=_self_serve_actions,
        check="llm_budgets.E130",
        doc="Self-serve actions (SELF_SERVE_ACTIONS) a host hides from tenant admins, on the "
        "pages and the API alike.",
    )
    SELF_SERVE_MAX_API_KEYS = Setting(
        default=10,
        read=_positive_int,
        check="llm_budgets.E131",
        doc="Live API keys a tenant may hold for its admins to create more themselves.",
    )
    PREPAID_PACKAGES = Setting(
        default={},
        read=_packages,
        check="llm_budgets.E078",
        doc='Prepaid top-up packages offered: {"name": "amount"}, e.g. {"starter": "10"}.',
    )
    PREPAID_TOP_UP_MAX = Setting(
        default="10000",
        read=_optional_amount,
        check="llm_budgets.E079",
        doc="The most one top-up of a typed amount may pay, in the installation's currency; "
        "None: no maximum.",
    )
    ALERTS_ALLOW_HTTP = Setting(
        default=False,
        read=_bool,
        check="llm_budgets.E101",
        doc="Plain http:// alert endpoints: refused unless DEBUG or this (an error outside "
        "DEBUG, llm_budgets.E110).",
    )
    ALERTS_ALLOWED_ADDRESSES = Setting(
        default=[],
        read=_address_list,
        check="llm_budgets.E102",
        doc="Private or reserved addresses (IPs or networks) an alert endpoint may resolve to "
        "outside DEBUG; every other such address is refused (SSRF).",
    )
    ALERTS_TIMEOUT_SECONDS = Setting(
        default=10,
        read=_positive_int,
        check="llm_budgets.E103",
        doc="Seconds one delivery attempt may take: connect, send, the whole answer.",
    )
    ALERTS_MAX_RESPONSE_BYTES = Setting(
        default=64 * 1024,
        read=_positive_int,
        check="llm_budgets.E104",
        doc="The most of an endpoint's answer read (the rest is not).",
    )
    ALERTS_RETRY_BASE_SECONDS = Setting(
        default=10,
        read=_positive_int,
        check="llm_budgets.E105",
        doc="Base of the exponential, jittered backoff between delivery attempts.",
    )
    ALERTS_RETRY_MAX_SECONDS = Setting(
        default=60 * 60,
        read=_positive_int,
        check="llm_budgets.E106",
        doc="The longest single wait between delivery attempts.",
    )
    ALERTS_RETRY_HORIZON_SECONDS = Setting(
        default=3 * 24 * 60 * 60,
        read=_positive_int,
        check="llm_budgets.E107",
        doc="A delivery still failing this long after its first attempt is given up ('failed').",
    )
    ALERTS_DISABLE_AFTER_FAILURES = Setting(
        default=20,
        read=_positive_int,
        check="llm_budgets.E108",
        doc="Failed attempts in a row that disable an endpoint (its owner is emailed).",
    )
    ALERTS_SECRET_OVERLAP_SECONDS = Setting(
        default=24 * 60 * 60,
        read=_overlap,
        check="llm_budgets.E109",
        doc="How long the old secret still signs after a rotation, by default.",
    )
    ALERTS_SECRET_OVERLAP_MAX_SECONDS = Setting(
        default=7 * 24 * 60 * 60,
        read=_positive_int,
        check="llm_budgets.E112",
        doc="The longest overlap a rotation may ask for (more is refused).",
    )
    ALERTS_EMAIL_CONFIRM_SECONDS = Setting(
        default=24 * 60 * 60,
        read=_positive_int,
        check="llm_budgets.E113",
        doc="How long the link confirming an email address of a tenant's endpoint stays valid.",
    )


conf = Settings()
