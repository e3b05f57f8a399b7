"""The app's settings: one dict, ``settings.LLM_BUDGETS``, read through a typed object.

Every access re-reads ``django.conf.settings`` so ``override_settings`` just works. Values are
validated by the system checks in :mod:`llm_budgets.checks`, not here: reading stays cheap on the
admission path.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Seconds a hold lives before the sweep expires it (per call: ``reserve(ttl=...)``).
    "DEFAULT_TTL_SECONDS": 120,
    # How long admission waits for a counter lock before refusing with LedgerUnavailable.
    "LOCK_TIMEOUT_SECONDS": 3,
    # What the sweep does with an overdue hold: "charge" its amount as estimated spend
    # (a timeout is no proof the provider stopped), or "release" it.
    "EXPIRED_HOLD_POLICY": "charge",
    # Currency of prices and limits (ISO 4217). One currency per installation for now.
    "CURRENCY": "USD",
    # Token counts above this are refused as absurd (InvalidUsage), per field and per call.
    "MAX_TOKENS_PER_CALL": 10_000_000,
    # Longest TTL a caller may ask for, in seconds.
    "MAX_TTL_SECONDS": 24 * 60 * 60,
    # Addresses emailed when a kill switch is tripped or cleared. Empty: no email.
    "OPERATOR_EMAILS": [],
    # Multiplier (>= 1) on the conservative token bound used for prompts of models that tiktoken
    # cannot count (see llm_budgets/tokens.py).
    "TOKEN_ESTIMATE_SAFETY_MARGIN": "1.10",
    # Requests per API key for the REST API (DRF rate syntax "N/second|minute|hour|day"), or None
    # for no limit. Counted in Django's default cache: use a shared one with several processes.
    "API_THROTTLE_RATE": "600/minute",
    # Failed API-key authentications per source address (REMOTE_ADDR; the X-Forwarded-For entry
    # DRF's NUM_PROXIES points at, when set) before that source is refused with 429 until the
    # window ends, or None for no limit. Counted in the database, across processes.
    "API_AUTH_FAILURE_RATE": "20/minute",
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
}

EXPIRED_HOLD_POLICIES = ("charge", "release")
UNCERTAIN_SETTLE_RULES = ("charge", "release")
WARNING_DELIVERIES = ("at_least_once", "at_most_once")


class Settings:
    """Shadow of ``settings.LLM_BUDGETS`` with defaults filled in."""

    def _get(self, key: str) -> Any:
        user = getattr(settings, "LLM_BUDGETS", None) or {}
        return user.get(key, DEFAULTS[key])

    @property
    def DEFAULT_TTL_SECONDS(self) -> int:
        return int(self._get("DEFAULT_TTL_SECONDS"))

    @property
    def LOCK_TIMEOUT_SECONDS(self) -> Decimal:
        return Decimal(str(self._get("LOCK_TIMEOUT_SECONDS")))

    @property
    def EXPIRED_HOLD_POLICY(self) -> str:
        return str(self._get("EXPIRED_HOLD_POLICY"))

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
    def RETENTION_REFUSALS_DAYS(self) -> int:
        return int(self._get("RETENTION_REFUSALS_DAYS"))

    @property
    def ROLLUP_LOOKBACK_DAYS(self) -> int:
        return int(self._get("ROLLUP_LOOKBACK_DAYS"))

    @property
    def TOKEN_ESTIMATE_SAFETY_MARGIN(self) -> Decimal:
        return Decimal(str(self._get("TOKEN_ESTIMATE_SAFETY_MARGIN")))

    @property
    def API_THROTTLE_RATE(self) -> str | None:
        rate = self._get("API_THROTTLE_RATE")
        return None if rate is None else str(rate)

    @property
    def API_AUTH_FAILURE_RATE(self) -> str | None:
        rate = self._get("API_AUTH_FAILURE_RATE")
        return None if rate is None else str(rate)


conf = Settings()
