"""Import prices from the data bundled with the ``genai-prices`` package. No network, ever: only
``genai_prices.data`` is read; its background updater is never started.

Each (provider, model) of the catalogue becomes price versions: the undated price from
``1970-01-01``, and one version per dated change (historical or announced for the future) from
that date, 00:00 UTC. Time-of-day prices become the version's daily spans; prompt-size tiers its
tiers. The import is idempotent, and:

- never touches a (provider, model) that has a manual price;
- never edits a version that is in effect or past: a changed current price becomes a new version
  from now, a changed historical one is skipped (history is never repriced); a changed future
  version, which nothing can reference yet, is replaced.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.models import Price, PriceSource
from llm_budgets.money import RATE_QUANTUM, RATE_SIGNIFICANT_DIGITS
from llm_budgets.pricing.costs import TOKEN_RATES
from llm_budgets.pricing.prices import (
    audit_price,
    comparable,
    plain,
    price_set,
    price_snapshot,
    price_values,
)

ACTOR = "llm_budgets_sync_prices"
UNDATED = datetime(1970, 1, 1, tzinfo=UTC)
THOUSAND = Decimal(1000)

# genai-prices price key -> our rate field (per million tokens).
RATE_KEYS = {
    "input_mtok": "input_per_mtok",
    "cache_read_mtok": "cached_input_per_mtok",
    "cache_write_mtok": "cache_write_per_mtok",
    "cache_write_1h_mtok": "cache_write_1h_per_mtok",
    "output_mtok": "output_per_mtok",
    "output_reasoning_mtok": "reasoning_per_mtok",
}
# genai-prices per-thousand-calls key -> our tool name.
TOOL_KEYS = {"web_searches_kcount": "web_search", "storage_searches_kcount": "storage_search"}


class Unsupported(Exception):
    """The catalogue prices the model in a way this app cannot represent."""


@dataclass(frozen=True)
class Change:
    action: str  # added | changed | unchanged | skipped
    provider: str
    model: str
    effective_from: datetime | None
    detail: str = ""

    def __str__(self) -> str:
        when = f" from {self.effective_from:%Y-%m-%d %H:%M}" if self.effective_from else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.action:9} {self.provider}/{self.model}{when}{detail}"


@dataclass
class SyncReport:
    source: str
    dry_run: bool
    changes: list[Change] = field(default_factory=list)
    ignored_dimensions: Tally[str] = field(default_factory=Tally)

    def count(self, action: str) -> int:
        return sum(1 for change in self.changes if change.action == action)

    @property
    def changed_anything(self) -> bool:
        return any(change.action in ("added", "changed") for change in self.changes)

    def skipped_reasons(self) -> Tally[str]:
        return Tally(change.detail for change in self.changes if change.action == "skipped")


def _decimal(value: Any) -> str:
    """A catalogue rate as stored: rounded (half-even) to what every database keeps exactly."""
    rate = Context(prec=RATE_SIGNIFICANT_DIGITS, rounding=ROUND_HALF_EVEN).plus(Decimal(value))
    return plain(rate.quantize(RATE_QUANTUM, rounding=ROUND_HALF_EVEN))


def _rates(model_price: Any, *, allow_tiers: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Our fields and tiers for one genai-prices ``ModelPrice``."""
    from genai_prices.types import TieredPrices

    values: dict[str, Any] = {}
    tiered: dict[str, Any] = {}
    for key, name in RATE_KEYS.items():
        value = getattr(model_price, key, None)
        if isinstance(value, TieredPrices):
            if not allow_tiers:
                raise Unsupported("time-of-day prices with prompt-size tiers")
            tiered[name] = value
            value = value.base
        values[name] = None if value is None else _decimal(value)
    thresholds = sorted({tier.start for prices in tiered.values() for tier in prices.tiers})
    tiers = []
    for threshold in thresholds:
        prices = {}
        for name, tiered_price in tiered.items():
            reached = [tier for tier in tiered_price.tiers if tier.start <= threshold]
            prices[name] = _decimal(reached[-1].price if reached else tiered_price.base)
        tiers.append({"above_input_tokens": threshold, "prices": prices})
    return values, tiers


def _version(base: Any, spans: list[Any], context_window: int | None) -> dict[str, Any]:
    values, tiers = _rates(base, allow_tiers=True)
    if values["input_per_mtok"] is None:
        raise Unsupported("no per-token input price")
    if values["output_per_mtok"] is None:
        values["output_per_mtok"] = "0"  # e.g. embeddings: no output tokens
    requests = getattr(base, "requests_kcount", None)
    values["per_request"] = _decimal(Decimal(requests) / THOUSAND) if requests else "0"
    values["tool_fees"] = {
        tool: _decimal(Decimal(getattr(base, key)) / THOUSAND)
        for key, tool in TOOL_KEYS.items()
        if getattr(base, key, None) is not None
    }
    values["tiers"] = tiers
    values["daily_spans"] = []
    for constraint, span_price in spans:
        span_values, _ = _rates(span_price, allow_tiers=False)
        values["daily_spans"].append(
            {
                "start": _utc_time(constraint.start_time),
                "end": _utc_time(constraint.end_time),
                "prices": {name: span_values[name] for name in TOKEN_RATES},
            }
        )
    values["context_window"] = context_window
    values["max_output_tokens"] = None
    return values


def _utc_time(value: time) -> str:
    """A time of day in UTC, without offset (naive catalogue times are UTC)."""
    if value.tzinfo is not None:
        value = datetime.combine(UNDATED.date(), value).astimezone(UTC).time()
    return value.isoformat()


def _ignored(model_price: Any) -> set[str]:
    known = {*RATE_KEYS, *TOOL_KEYS, "requests_kcount"}
    return {
        key
        for key, value in model_price.__dict__.items()
        if value is not None and not key.startswith("_") and key not in known
    }


def _resolve(model: Any, day: date) -> tuple[Any, list[Any]]:
    """The base price and time-of-day spans in effect on ``day`` (genai-prices' rule: the last
    active conditional price wins; time-of-day ones apply only during their span)."""
    from genai_prices.types import ModelPrice, StartDateConstraint, TimeOfDateConstraint

    if isinstance(model.prices, ModelPrice):
        return model.prices, []
    spans: list[Any] = []
    for conditional in reversed(model.prices):
        constraint = conditional.constraint
        if isinstance(constraint, TimeOfDateConstraint):
            spans.append((constraint, conditional.prices))
        elif constraint is None or (
            isinstance(constraint, StartDateConstraint) and constraint.start_date <= day
        ):
            return conditional.prices, spans
    return model.prices[0].prices, spans


def catalogue_versions(model: Any) -> tuple[list[tuple[datetime, dict[str, Any]]], set[str]]:
    """A genai-prices model's versions ``(effective_from, fields)``, oldest first, and the price
    keys this app does not model (audio, images, ...)."""
    from genai_prices.types import ModelPrice, StartDateConstraint

    days = [UNDATED.date()]
    if not isinstance(model.prices, ModelPrice):
        days += sorted(
            {
                c.constraint.start_date
                for c in model.prices
                if isinstance(c.constraint, StartDateConstraint)
            }
        )
    versions: list[tuple[datetime, dict[str, Any]]] = []
    ignored: set[str] = set()
    for day in days:
        base, spans = _resolve(model, day)
        ignored |= _ignored(base)
        values = price_values(**_version(base, spans, model.context_window))
        if not versions or comparable(versions[-1][1]) != comparable(values):
            versions.append((datetime.combine(day, datetime.min.time(), tzinfo=UTC), values))
    return versions, ignored


def _catalogue(provider: str | None, model: str | None) -> Iterator[tuple[str, Any]]:
    from genai_prices.data import providers  # the bundled snapshot: no network

    for catalogue_provider in providers:
        if provider is not None and catalogue_provider.id != provider:
            continue
        for catalogue_model in catalogue_provider.models:
            if model is None or catalogue_model.id == model:
                yield catalogue_provider.id, catalogue_model


def _plan_model(
    provider: str, model: Any, now: datetime, report: SyncReport
) -> list[tuple[Change, dict[str, Any] | None, Price | None]]:
    """What syncing one model would do: (change, fields to write, version to replace)."""
    stored = list(
        Price.objects.filter(provider=provider, model=model.id).order_by("effective_from")
    )
    if any(price.source == PriceSource.MANUAL for price in stored):
        return [(Change("skipped", provider, model.id, None, "has a manual price"), None, None)]
    try:
        versions, ignored = catalogue_versions(model)
    except Unsupported as exc:
        return [(Change("skipped", provider, model.id, None, str(exc)), None, None)]
    except Exception as exc:
        return [(Change("skipped", provider, model.id, None, f"invalid: {exc}"), None, None)]
    report.ignored_dimensions.update(ignored)
    plan: list[tuple[Change, dict[str, Any] | None, Price | None]] = []
    for index, (starts, values) in enumerate(versions):
        ends = versions[index + 1][0] if index + 1 < len(versions) else None
        window = [
            p
            for p in stored
            if p.effective_from >= starts and (ends is None or p.effective_from < ends)
        ]
        if not window:
            plan.append((Change("added", provider, model.id, starts), values, None))
            continue
        newest = window[-1]
        if price_snapshot(newest) == comparable(values):
            plan.append(
                (Change("unchanged", provider, model.id, newest.effective_from), None, None)
            )
        elif newest.effective_from > now:
            change = Change("changed", provider, model.id, starts, "future version replaced")
            plan.append((change, values, newest))
        elif ends is not None and ends <= now:
            detail = "historical price differs; history is never repriced"
            plan.append((Change("skipped", provider, model.id, starts, detail), None, None))
        else:
            change = Change("changed", provider, model.id, now, "new version from now")
            plan.append((change, values, None))
    return plan


def prices_sync(
    *,
    provider: str | None = None,
    model: str | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SyncReport:
    """Bring price versions in line with genai-prices' bundled catalogue (see the module doc).
    With ``dry_run`` nothing is written; the report says what would change."""
    from genai_prices import __version__

    now = now or timezone.now()
    report = SyncReport(source=f"genai-prices {__version__}", dry_run=dry_run)
    entries = list(_catalogue(provider, model))
    if conf.CURRENCY != "USD":
        for provider_id, catalogue_model in entries:
            detail = f"catalogue is in USD, prices here are in {conf.CURRENCY}"
            report.changes.append(Change("skipped", provider_id, catalogue_model.id, None, detail))
        return report
    for done, (provider_id, catalogue_model) in enumerate(entries, start=1):
        with transaction.atomic():
            plan = _plan_model(provider_id, catalogue_model, now, report)
            for change, values, replaced in plan:
                if values is not None and not dry_run:
                    _write(change, values, replaced, report.source)
                report.changes.append(change)
        if progress is not None:
            progress(done, len(entries))
    return report


def _write(change: Change, values: dict[str, Any], replaced: Price | None, source: str) -> None:
    before = None
    if replaced is not None:
        before = price_snapshot(replaced)
        replaced.delete()  # PROTECT refuses if anything references it
    price = price_set(
        provider=change.provider,
        model=change.model,
        effective_from=change.effective_from,
        source=PriceSource.IMPORTED,
        source_detail=source,
        actor=ACTOR,
        **values,
    )
    if before is not None:
        audit_price(price, action="price.replace_future", actor=ACTOR, before=before)
