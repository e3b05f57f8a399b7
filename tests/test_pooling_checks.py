"""``LLM_BUDGETS["POOLER"]`` and the warnings about settings that break behind a transaction
pooler (llm_budgets.E060, W060-W062)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from llm_budgets.checks import check_settings, check_transaction_pooling


@pytest.fixture
def postgres_options() -> Iterator[dict[str, Any]]:
    """The default alias's settings dict, restored after the test (the check reads it)."""
    conn = connections["default"]
    saved = {k: conn.settings_dict.get(k) for k in ("OPTIONS", "DISABLE_SERVER_SIDE_CURSORS")}
    conn.settings_dict["OPTIONS"] = dict(saved["OPTIONS"] or {})
    yield conn.settings_dict
    conn.settings_dict.update(saved)


def _ids(messages: list[Any]) -> list[str]:
    return sorted(str(m.id) for m in messages)


@pytest.mark.parametrize("value", ["transactions", "Transaction", 1, True])
def test_an_unknown_pooler_is_an_error(value: object) -> None:
    with override_settings(LLM_BUDGETS={"POOLER": value}):
        assert "llm_budgets.E060" in _ids(check_settings())


@pytest.mark.parametrize("value", [None, "session", "transaction"])
def test_the_pool_modes_are_accepted(value: object) -> None:
    with override_settings(LLM_BUDGETS={"POOLER": value}):
        assert _ids(check_settings()) == []


@pytest.mark.parametrize("value", [0, -5, "300", 1.5])
def test_the_health_sweep_lag_must_be_positive_seconds(value: object) -> None:
    with override_settings(LLM_BUDGETS={"HEALTH_SWEEP_MAX_LAG_SECONDS": value}):
        assert _ids(check_settings()) == ["llm_budgets.E061"]


def test_prepare_threshold_with_transaction_pooling_warns(
    postgres_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(connections["default"]), "vendor", "postgresql")
    postgres_options["OPTIONS"]["prepare_threshold"] = 5
    postgres_options["DISABLE_SERVER_SIDE_CURSORS"] = True
    with override_settings(LLM_BUDGETS={"POOLER": "transaction"}):
        messages = check_transaction_pooling(databases=["default"])
    assert _ids(messages) == ["llm_budgets.W060"]
    assert "prepare_threshold" in messages[0].msg
    # The same options without a transaction pooler: nothing to say.
    for pooler in (None, "session"):
        with override_settings(LLM_BUDGETS={"POOLER": pooler}):
            assert check_transaction_pooling(databases=["default"]) == []


def test_server_side_binding_and_cursors_with_transaction_pooling_warn(
    postgres_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(connections["default"]), "vendor", "postgresql")
    postgres_options["OPTIONS"]["server_side_binding"] = True
    postgres_options["DISABLE_SERVER_SIDE_CURSORS"] = False
    with override_settings(LLM_BUDGETS={"POOLER": "transaction"}):
        assert _ids(check_transaction_pooling(databases=["default"])) == [
            "llm_budgets.W061",
            "llm_budgets.W062",
        ]


def test_a_clean_postgresql_alias_behind_transaction_pooling_passes(
    postgres_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(connections["default"]), "vendor", "postgresql")
    postgres_options["OPTIONS"].pop("prepare_threshold", None)
    postgres_options["OPTIONS"].pop("server_side_binding", None)
    postgres_options["DISABLE_SERVER_SIDE_CURSORS"] = True
    with override_settings(LLM_BUDGETS={"POOLER": "transaction"}):
        assert check_transaction_pooling(databases=["default"]) == []
