"""The one money format and the one clock (issue 14 items 1 and 2)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.template import Context, Template

from llm_budgets.clock import day, readable, timezone_choices, when
from llm_budgets.money import exact, money, money_html, rate


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [
        ("9998.6529400000", "USD", "9,998.65 USD"),
        ("0.83506", "USD", "0.84 USD"),
        ("199.445", "USD", "199.44 USD"),  # half-even, as charges round
        ("199.455", "USD", "199.46 USD"),
        ("0", "USD", "0.00 USD"),
        ("-0.0200000000", "USD", "-0.02 USD"),
        ("1234567.891", "EUR", "1,234,567.89 EUR"),
        ("0.0000750000", "USD", "< 0.01 USD"),  # not a misleading 0.00
        ("-0.004", "USD", "> -0.01 USD"),
        ("1234.5", "JPY", "1,234 JPY"),
        ("1.2345", "KWD", "1.234 KWD"),
    ],
)
def test_money_has_the_currencys_places_separators_and_code(
    amount: str, currency: str, shown: str
) -> None:
    assert money(Decimal(amount), currency) == shown


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ("0.800000000000000000", "0.80 USD / 1M tokens"),
        ("0.0375", "0.0375 USD / 1M tokens"),
        ("15", "15.00 USD / 1M tokens"),
        ("1250", "1,250.00 USD / 1M tokens"),
        ("0.041666666666666664", "0.04166667 USD / 1M tokens"),
    ],
)
def test_rates_show_the_digits_they_need_with_their_unit(amount: str, shown: str) -> None:
    assert rate(Decimal(amount), "USD") == shown


def test_the_exact_value_is_on_hover() -> None:
    assert exact(Decimal("9998.6529400000"), "USD") == "9998.65294 USD"
    html = str(money_html(Decimal("9998.65294"), "USD"))
    assert 'title="exact: 9998.65294 USD"' in html
    assert ">9,998.65 USD</span>" in html
    assert money_html(None, "USD") == "-"


def test_template_filters_use_the_same_format() -> None:
    template = Template(
        "{% load llm_budgets_money %}{{ a|money_plain:'USD' }}|{{ r|rate:'USD' }}|{{ t|when:tz }}"
    )
    text = template.render(
        Context(
            {
                "a": Decimal("1234.5"),
                "r": Decimal("0.8"),
                "t": datetime(2026, 12, 5, 17, 0, tzinfo=UTC),
                "tz": "Europe/Paris",
            }
        )
    )
    assert text.startswith("1,234.50 USD|<span")
    assert text.endswith("|Sat 5 Dec 2026 18:00 CET")


def test_one_clock_labels_the_tenants_timezone_and_its_summer_time() -> None:
    winter = datetime(2026, 12, 1, 11, 10, 3, tzinfo=UTC)
    summer = datetime(2026, 7, 1, 11, 10, tzinfo=UTC)
    assert when(winter, "Europe/Paris") == "Tue 1 Dec 2026 12:10 CET"
    assert when(winter, "Europe/Paris", seconds=True) == "Tue 1 Dec 2026 12:10:03 CET"
    assert when(summer, "Europe/Paris") == "Wed 1 Jul 2026 13:10 CEST"
    assert when(winter, None) == "Tue 1 Dec 2026 11:10 UTC"  # no tenant: the site's zone
    assert when(winter, "Mars/Olympus") == "Tue 1 Dec 2026 11:10 UTC"  # never a crash
    assert when(None, "UTC") == "-"


def test_dates_and_iso_times_in_stored_text_read_in_the_one_format() -> None:
    assert day(date(2026, 10, 25)) == "Sun 25 Oct 2026"
    assert day(None) == "-"
    target = "price openai/gpt-4o from 2024-01-01T00:00:00+00:00"
    assert readable(target, "Europe/Paris") == "price openai/gpt-4o from Mon 1 Jan 2024 01:00 CET"
    assert readable("at 2026-12-05T00:49:03.5+00:00", None) == "at Sat 5 Dec 2026 00:49:03 UTC"
    assert readable("no time here, 2026-13-45T99:99", None) == "no time here, 2026-13-45T99:99"


def test_timezones_are_chosen_from_the_iana_list() -> None:
    names = [name for name, _ in timezone_choices()]
    assert "Europe/Amsterdam" in names
    assert "America/New_York" in names
    assert names == sorted(names)
