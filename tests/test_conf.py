"""Settings object and system checks (llm_budgets.E0xx / W001)."""

from __future__ import annotations

import ast
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from llm_budgets.checks import check_row_locking, check_settings
from llm_budgets.conf import conf


def ids(**settings: Any) -> list[str]:
    with override_settings(LLM_BUDGETS=settings):
        return [message.id or "" for message in check_settings()]


def test_defaults_apply_and_a_change_django_signals_is_read_again() -> None:
    """Values are kept once read (a call reads about twenty), and read again when Django says
    the settings changed: entering and leaving ``override_settings`` both count."""
    with override_settings(LLM_BUDGETS={}):
        assert conf.DEFAULT_TTL_SECONDS == 120
        assert conf.EXPIRED_HOLD_POLICY == "charge"
        with override_settings(
            LLM_BUDGETS={"DEFAULT_TTL_SECONDS": 30, "LOCK_TIMEOUT_SECONDS": 0.5}
        ):
            assert conf.DEFAULT_TTL_SECONDS == 30
            assert Decimal("0.5") == conf.LOCK_TIMEOUT_SECONDS
        assert conf.DEFAULT_TTL_SECONDS == 120


def test_the_project_settings_pass_every_check() -> None:
    assert check_settings() == []


def test_the_settings_must_be_a_dict() -> None:
    with override_settings(LLM_BUDGETS=["DEFAULT_TTL_SECONDS"]):
        assert [m.id for m in check_settings()] == ["llm_budgets.E001"]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"DEFAULT_TTL": 10}, "llm_budgets.E002"),
        ({"DEFAULT_TTL_SECONDS": 0}, "llm_budgets.E003"),
        ({"DEFAULT_TTL_SECONDS": "120"}, "llm_budgets.E003"),
        ({"LOCK_TIMEOUT_SECONDS": 0}, "llm_budgets.E004"),
        ({"LOCK_TIMEOUT_SECONDS": 600}, "llm_budgets.E004"),
        ({"LOCK_TIMEOUT_SECONDS": True}, "llm_budgets.E004"),
        ({"EXPIRED_HOLD_POLICY": "forget"}, "llm_budgets.E005"),
        ({"CURRENCY": "usd"}, "llm_budgets.E006"),
        ({"MAX_TOKENS_PER_CALL": -1}, "llm_budgets.E007"),
        ({"MAX_TTL_SECONDS": 60}, "llm_budgets.E008"),  # below the default TTL of 120
        ({"TRUSTED_PROXIES": -1}, "llm_budgets.E091"),
        ({"TRUSTED_PROXIES": "1"}, "llm_budgets.E091"),
        ({"TRUSTED_PROXIES": True}, "llm_budgets.E091"),
        ({"NEW_END_USERS_PER_DAY": 0}, "llm_budgets.E012"),
        ({"NEW_RUNS_PER_DAY": "many"}, "llm_budgets.E013"),
        # Issue 38: the maximums of the alerts, keys and top-ups.
        ({"ALERTS_SECRET_OVERLAP_SECONDS": 10**9}, "llm_budgets.E109"),  # above the maximum
        ({"ALERTS_SECRET_OVERLAP_MAX_SECONDS": 0}, "llm_budgets.E112"),
        ({"ALERTS_EMAIL_CONFIRM_SECONDS": "1 day"}, "llm_budgets.E113"),
        ({"SELF_SERVE_MAX_API_KEYS": 0}, "llm_budgets.E131"),
        ({"PREPAID_TOP_UP_MAX": "1e4"}, "llm_budgets.E079"),
        ({"PREPAID_TOP_UP_MAX": 10000.0}, "llm_budgets.E079"),
        ({"PREPAID_TOP_UP_MAX": "0"}, "llm_budgets.E079"),
    ],
)
def test_each_bad_value_has_its_own_check(settings: dict[str, Any], expected: str) -> None:
    assert ids(**settings) == [expected]


def test_unlockable_sqlite_gets_a_warning() -> None:
    connection = connections["default"]
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    try:
        options.pop("transaction_mode", None)
        warnings = check_row_locking(databases=["default"])
    finally:
        options.clear()
        options.update(saved)
    if connection.vendor == "sqlite":
        assert [w.id for w in warnings] == ["llm_budgets.W001"]
    else:
        assert warnings == []  # PostgreSQL locks rows whatever the options say
    assert check_row_locking(databases=["default"]) == []


# Settings read once, checked as read (issue #10, item 7): the checks run the readers the code
# uses, so a value the checks pass is exactly the value the code gets, and a value they refuse
# is never coerced into something else at run time.


def test_every_setting_has_one_reader_and_one_check() -> None:
    from llm_budgets.checks import CHECK_IDS
    from llm_budgets.conf import DEFAULTS, READERS, SETTINGS, Settings

    assert list(READERS) == list(DEFAULTS) == list(CHECK_IDS) == list(SETTINGS)
    assert len(set(CHECK_IDS.values())) == len(CHECK_IDS)
    assert all(re.fullmatch(r"llm_budgets\.E\d{3}", check) for check in CHECK_IDS.values())
    for key, setting in SETTINGS.items():
        assert getattr(Settings, key) is setting
        assert setting.key == key
        assert setting.doc.strip()
        assert DEFAULTS[key] is setting.default
        assert READERS[key] is setting.read


# Each setting declared once (issue [split], item 4): an app declares its own keys in its own
# class, read from the same LLM_BUDGETS dict and known to the same checks.


def test_a_setting_declared_elsewhere_is_read_and_checked_like_the_apps_own() -> None:
    from llm_budgets.conf import SETTINGS, Setting, SettingError

    def read(key: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return tuple(value)
        raise SettingError(key, f"LLM_BUDGETS[{key!r}] must be a list of integers.", "Got it.")

    class ContribSettings:
        CONTRIB_SIZES = Setting(default=[1, 2], read=read, check="llm_budgets.E999", doc="Sizes.")

    contrib = ContribSettings()
    try:
        with override_settings(LLM_BUDGETS={}):
            assert contrib.CONTRIB_SIZES == (1, 2)
            assert check_settings() == []
        with override_settings(LLM_BUDGETS={"CONTRIB_SIZES": [3]}):
            assert contrib.CONTRIB_SIZES == (3,)
            assert check_settings() == []  # not an unknown key (E002)
        assert ids(CONTRIB_SIZES="3") == ["llm_budgets.E999"]
    finally:
        del SETTINGS["CONTRIB_SIZES"]
    assert ids(CONTRIB_SIZES=[3]) == ["llm_budgets.E002"]


def test_a_key_declared_twice_is_refused() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from llm_budgets.conf import SETTINGS, Setting, Settings

    with pytest.raises((ImproperlyConfigured, RuntimeError)) as refused:

        class Again:
            CURRENCY = Setting(default="EUR", read=Settings.CURRENCY.read, check="E", doc="Again.")

    # Python 3.11 wraps an error of __set_name__ in a RuntimeError.
    assert "declared twice" in str(refused.value.__cause__ or refused.value)
    assert SETTINGS["CURRENCY"] is Settings.CURRENCY


def test_a_list_or_dict_read_is_a_copy() -> None:
    """A caller changing what it read changes neither the kept value nor the default."""
    from llm_budgets.conf import DEFAULTS

    with override_settings(LLM_BUDGETS={}):
        conf.WARNING_THRESHOLDS.append(1)
        conf.SELF_SERVE_HIDDEN_ACTIONS.append("budgets")
        conf.PREPAID_PACKAGES["free"] = Decimal(0)
        assert conf.WARNING_THRESHOLDS == [50, 80, 100] == DEFAULTS["WARNING_THRESHOLDS"]
        assert conf.SELF_SERVE_HIDDEN_ACTIONS == [] == DEFAULTS["SELF_SERVE_HIDDEN_ACTIONS"]
        assert conf.PREPAID_PACKAGES == {} == DEFAULTS["PREPAID_PACKAGES"]


def settings_doc_rows() -> list[list[str]]:
    """The rows of docs/settings.md's tables of keys (``| Key | Default | Check | ...``), each
    its cells."""
    doc = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
    rows, in_table = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("| Key | Default | Check |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and line.startswith("| `"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_docs_settings_md_has_a_row_for_every_declared_key_as_declared() -> None:
    """Its Key, Default and Check columns are the declarations' (the declaration is the truth)."""
    from llm_budgets.conf import SETTINGS

    rows = settings_doc_rows()
    documented = [cells[0].strip("`") for cells in rows]
    assert sorted(set(SETTINGS) - set(documented)) == []  # declared, not documented
    assert sorted(set(documented) - set(SETTINGS)) == []  # documented, not declared
    assert len(documented) == len(set(documented))  # no key twice
    for key, default, check, *_ in rows:
        setting = SETTINGS[key.strip("`")]
        value = ast.literal_eval(default.strip("`"))
        assert (type(value), value) == (type(setting.default), setting.default), key
        assert re.findall(r"llm_budgets\.[EW]\d{3}", check)[:1] == [setting.check], key


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFAULT_TTL_SECONDS", "120"),  # conf used to coerce this while the check refused it
        ("MAX_TOKENS_PER_CALL", 1.5),
        ("LOCK_TIMEOUT_SECONDS", "3"),
        ("OPERATOR_EMAILS", ["ops@"]),
        ("WARNING_THRESHOLDS", [50, 50]),
        ("TOKEN_ESTIMATE_SAFETY_MARGIN", 0.5),
    ],
)
def test_a_value_the_checks_refuse_is_refused_where_it_is_read(key: str, value: Any) -> None:
    from llm_budgets.conf import SettingError

    with override_settings(LLM_BUDGETS={key: value}):
        (error,) = check_settings()
        with pytest.raises(SettingError) as refused:
            getattr(conf, key)
    assert refused.value.message == error.msg
    assert refused.value.hint == error.hint


@pytest.mark.parametrize(
    "address",
    ["ops@example.com", "Ops Team <ops@example.com>"],
)
def test_every_email_setting_takes_the_same_addresses(address: str) -> None:
    from llm_budgets.models.fields import validate_email_list

    with override_settings(
        LLM_BUDGETS={"OPERATOR_EMAILS": [address], "WARNING_FROM_EMAIL": address}
    ):
        assert check_settings() == []
        assert [address] == conf.OPERATOR_EMAILS
        assert address == conf.WARNING_FROM_EMAIL
    validate_email_list(address)  # a tenant's billing emails


@pytest.mark.parametrize("address", ["ops@", "no at sign", "Ops <not an address>"])
def test_every_email_setting_refuses_the_same_addresses(address: str) -> None:
    from django.core.exceptions import ValidationError

    from llm_budgets.models.fields import validate_email_list

    assert ids(OPERATOR_EMAILS=[address], WARNING_FROM_EMAIL=address) == [
        "llm_budgets.E025",
        "llm_budgets.E040",
    ]
    with pytest.raises(ValidationError):
        validate_email_list(address)


class ElsewhereRouter:
    """Sends the app's models to another database, which the hot path would not follow."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return "replica" if model._meta.app_label == "llm_budgets" else None  # type: ignore[attr-defined]

    db_for_write = db_for_read


class OtherAppsRouter:
    """Routes only the host's own models: allowed."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return "replica" if model._meta.app_label == "reporting" else None  # type: ignore[attr-defined]

    db_for_write = db_for_read


def test_a_router_sending_the_apps_models_elsewhere_is_refused() -> None:
    from llm_budgets.checks import check_database_routing

    assert check_database_routing() == []
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.OtherAppsRouter"]):
        assert check_database_routing() == []
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ElsewhereRouter"]):
        messages = check_database_routing()
    assert messages
    assert {m.id for m in messages} == {"llm_budgets.E050"}
    assert any("llm_budgets.Counter" in m.msg for m in messages)


def test_trusted_proxies_default_to_none_and_are_re_read() -> None:
    with override_settings(LLM_BUDGETS={}):
        assert conf.TRUSTED_PROXIES == 0
    with override_settings(LLM_BUDGETS={"TRUSTED_PROXIES": 2}):
        assert conf.TRUSTED_PROXIES == 2


def test_drf_num_proxies_alone_gets_a_warning() -> None:
    from llm_budgets.checks import check_forwarded_for

    with override_settings(REST_FRAMEWORK={"NUM_PROXIES": 1}, LLM_BUDGETS={}):
        assert [w.id for w in check_forwarded_for()] == ["llm_budgets.W091"]
    with override_settings(REST_FRAMEWORK={"NUM_PROXIES": 1}, LLM_BUDGETS={"TRUSTED_PROXIES": 1}):
        assert check_forwarded_for() == []
    with override_settings(REST_FRAMEWORK={}, LLM_BUDGETS={}):
        assert check_forwarded_for() == []


def test_the_issue_38_maximums_have_their_defaults_and_may_be_set() -> None:
    assert conf.ALERTS_SECRET_OVERLAP_MAX_SECONDS == 7 * 24 * 3600
    assert conf.ALERTS_EMAIL_CONFIRM_SECONDS == 24 * 3600
    assert conf.SELF_SERVE_MAX_API_KEYS == 10
    assert conf.PREPAID_TOP_UP_MAX == 10000
    with override_settings(
        LLM_BUDGETS={
            "ALERTS_SECRET_OVERLAP_SECONDS": 10**6,
            "ALERTS_SECRET_OVERLAP_MAX_SECONDS": 10**6,
            "PREPAID_TOP_UP_MAX": None,
        }
    ):
        assert check_settings() == []
        assert conf.ALERTS_SECRET_OVERLAP_SECONDS == 10**6
        assert conf.PREPAID_TOP_UP_MAX is None


@pytest.mark.parametrize(
    "value",
    [
        {"openai": {"priority": 2.0}},  # a float is not the figure written
        {"openai": {"priority": "0"}},
        {"openai": {"priority": "-1"}},
        {"openai": {"fast+geo": "2"}},  # "+" joins modifiers
        {"openai": ["priority"]},
        ["openai"],
    ],
)
def test_service_tier_multipliers_are_positive_decimals_by_provider(value: Any) -> None:
    assert ids(SERVICE_TIER_MULTIPLIERS=value) == ["llm_budgets.E031"]


def test_service_tier_multipliers_default_to_the_published_figures() -> None:
    assert {
        "openai": {"priority": Decimal(2), "flex": Decimal("0.5")},
        "anthropic": {"fast": Decimal(6), "geo_us": Decimal("1.1")},
    } == conf.SERVICE_TIER_MULTIPLIERS
