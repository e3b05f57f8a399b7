"""llm_budgets_sync_prices (issue 3 item 2): offline, idempotent, dry run, manual prices kept."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.models import AuditEvent, Price, PriceSource
from llm_budgets.pricing.prices import price_in_effect
from llm_budgets.pricing.sync import prices_sync

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _offline(no_network: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    import genai_prices

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("genai-prices' background updater was started")

    monkeypatch.setattr(genai_prices.UpdatePrices, "start", never)


def _sync(*args: str) -> str:
    out = StringIO()
    call_command("llm_budgets_sync_prices", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_guard_refuses_network_access() -> None:
    with pytest.raises(AssertionError, match="network access attempted"):
        socket.create_connection(("example.com", 443))


def test_sync_imports_then_a_second_run_changes_nothing() -> None:
    first = _sync("--provider", "anthropic")
    assert "added" in first
    count = Price.objects.filter(provider="anthropic").count()
    assert count > 10
    assert not Price.objects.exclude(source=PriceSource.IMPORTED).exists()
    second = _sync("--provider", "anthropic")
    assert "added 0, changed 0," in second
    assert "Nothing to change: prices are up to date." in second
    assert Price.objects.count() == count


def test_dry_run_prints_the_changes_and_writes_nothing() -> None:
    out = _sync("--provider", "anthropic", "--dry-run")
    assert "would be added" in out
    assert "dry run, nothing written" in out
    assert not Price.objects.exists()
    assert not AuditEvent.objects.exists()


def test_filters_by_model() -> None:
    _sync("--provider", "openai", "--model", "gpt-4o")
    assert set(Price.objects.values_list("provider", "model")) == {("openai", "gpt-4o")}


def test_a_manual_price_is_never_overridden() -> None:
    manual = budgets.set_price(
        provider="openai", model="gpt-4o", input_per_mtok="1", output_per_mtok="1"
    )
    out = _sync("--provider", "openai", "--model", "gpt-4o")
    assert "skipped 1: has a manual price" in out
    assert [p.pk for p in Price.objects.all()] == [manual.id]


def test_historical_and_future_versions_are_imported_with_their_dates() -> None:
    report = prices_sync(provider="openrouter", model="google/gemini-3.8-flash")
    dates = list(
        Price.objects.filter(model="google/gemini-3.8-flash")
        .order_by("effective_from")
        .values_list("effective_from", flat=True)
    )
    assert report.count("added") == len(dates) == 3
    assert dates[0] == datetime(1970, 1, 1, tzinfo=UTC)
    assert dates[1] == datetime(2026, 10, 19, tzinfo=UTC)
    # The dated price is in effect from its day on, the undated one before it.
    before = price_in_effect(
        provider="openrouter", model="google/gemini-3.8-flash", at=dates[1] - timedelta(seconds=1)
    )
    after = price_in_effect(provider="openrouter", model="google/gemini-3.8-flash", at=dates[1])
    assert before.input_per_mtok == Decimal("0.75")
    assert after.input_per_mtok == Decimal("0.825")


def test_time_of_day_prices_become_daily_spans() -> None:
    prices_sync(provider="deepseek")
    spans = [p.daily_spans for p in Price.objects.filter(provider="deepseek") if p.daily_spans]
    assert spans, "deepseek's off-peak prices were not imported"
    assert {(s["start"], s["end"]) for span in spans for s in span} >= {("00:30:00", "16:30:00")}


def test_a_changed_current_price_becomes_a_new_version_from_now() -> None:
    prices_sync(provider="openai", model="gpt-4o")
    old = Price.objects.get()
    Price.objects.filter(pk=old.pk).update(
        input_per_mtok=Decimal("99")
    )  # as if the catalogue moved
    now = timezone.now()
    report = prices_sync(provider="openai", model="gpt-4o", now=now)
    assert report.count("changed") == 1
    versions = list(Price.objects.order_by("effective_from"))
    assert versions[0].input_per_mtok == Decimal("99")  # never edited
    assert versions[1].effective_from == now
    assert versions[1].input_per_mtok == Decimal("2.5")
    assert prices_sync(provider="openai", model="gpt-4o").count("changed") == 0


def test_a_changed_historical_price_is_skipped_not_repriced() -> None:
    prices_sync(provider="openrouter", model="google/gemini-3.8-flash")
    first = Price.objects.get(effective_from=datetime(1970, 1, 1, tzinfo=UTC))
    Price.objects.filter(pk=first.pk).update(input_per_mtok=Decimal("99"))
    report = prices_sync(
        provider="openrouter",
        model="google/gemini-3.8-flash",
        now=datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert report.skipped_reasons() == {"historical price differs; history is never repriced": 1}
    assert Price.objects.get(pk=first.pk).input_per_mtok == Decimal("99")


def test_a_changed_future_version_is_replaced() -> None:
    prices_sync(provider="openrouter", model="google/gemini-3.8-flash")
    future = Price.objects.get(effective_from=datetime(2026, 11, 3, tzinfo=UTC))
    Price.objects.filter(pk=future.pk).update(input_per_mtok=Decimal("99"))
    report = prices_sync(
        provider="openrouter",
        model="google/gemini-3.8-flash",
        now=datetime(2026, 10, 1, tzinfo=UTC),
    )
    assert report.count("changed") == 1
    replaced = Price.objects.get(effective_from=datetime(2026, 11, 3, tzinfo=UTC))
    assert replaced.input_per_mtok == Decimal("0.75")
    assert AuditEvent.objects.filter(action="price.replace_future").count() == 1


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    from llm_budgets.management.commands.llm_budgets_sync_prices import ProgressBar

    class Terminal(StringIO):
        def isatty(self) -> bool:
            return True

    terminal, pipe = Terminal(), StringIO()
    for stream in (terminal, pipe):
        bar = ProgressBar(stream, width=4)
        bar(1, 2)
        bar(2, 2)
    assert terminal.getvalue() == "\r[##--] 1/2 models\r[####] 2/2 models\n"
    assert pipe.getvalue() == ""
