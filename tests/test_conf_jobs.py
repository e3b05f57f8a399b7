"""System checks for the job and warning settings (llm_budgets.E020-E027)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from llm_budgets.checks import check_settings
from llm_budgets.conf import DEFAULTS, conf


def _ids(**settings: Any) -> list[str]:
    with override_settings(LLM_BUDGETS=settings):
        return [message.id or "" for message in check_settings()]


def test_defaults_pass() -> None:
    assert _ids() == []
    assert DEFAULTS["WARNING_THRESHOLDS"] == conf.WARNING_THRESHOLDS


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("UNCERTAIN_SETTLE_RULE", "ignore", "llm_budgets.E020"),
        ("UNCERTAIN_MAX_AGE_SECONDS", 0, "llm_budgets.E021"),
        ("WARNING_THRESHOLDS", [50, 150], "llm_budgets.E022"),
        ("WARNING_THRESHOLDS", [80, 80], "llm_budgets.E022"),
        ("WARNING_THRESHOLDS", None, "llm_budgets.E022"),
        ("WARNING_DELIVERY", "exactly_once", "llm_budgets.E023"),
        ("WARNING_CLAIM_TIMEOUT_SECONDS", -1, "llm_budgets.E024"),
        ("WARNING_FROM_EMAIL", "not an address", "llm_budgets.E025"),
        ("RETENTION_RELEASED_DAYS", 1.5, "llm_budgets.E026"),
        ("ROLLUP_LOOKBACK_DAYS", True, "llm_budgets.E027"),
        ("RETENTION_REFUSALS_DAYS", 0, "llm_budgets.E028"),
    ],
)
def test_bad_values_are_errors(key: str, value: Any, error: str) -> None:
    assert _ids(**{key: value}) == [error]


def test_good_values_are_read_typed() -> None:
    good = {
        "UNCERTAIN_SETTLE_RULE": "release",
        "WARNING_THRESHOLDS": [],
        "WARNING_DELIVERY": "at_most_once",
        "WARNING_FROM_EMAIL": "Budgets <budgets@example.com>",
    }
    assert _ids(**good) == []
    with override_settings(LLM_BUDGETS=good):
        assert conf.WARNING_FROM_EMAIL == "Budgets <budgets@example.com>"
        assert conf.WARNING_THRESHOLDS == []
    with override_settings(LLM_BUDGETS={}, DEFAULT_FROM_EMAIL="ops@example.com"):
        assert conf.WARNING_FROM_EMAIL == "ops@example.com"
