"""Price versions: which is in effect, how a request is priced when its model has none (the plan's
unknown-model policy), the output ceiling, and adding versions. The arithmetic is in ``costs.py``.

A version is never edited once a reservation or ledger line references it: a change is a new
version, and the newest version that has started wins.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, time
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.db import statements as sql
from llm_budgets.exceptions import InvalidUsage, UnknownPrice
from llm_budgets.models import (
    AuditEvent,
    Plan,
    Price,
    PriceSource,
    PricingBasis,
    Reservation,
    UnknownModelPolicy,
    UsageRecord,
)
from llm_budgets.money import RATE_DECIMAL_PLACES, RATE_QUANTUM, RATE_SIGNIFICANT_DIGITS
from llm_budgets.pricing import costs, model_names
from llm_budgets.pricing.costs import TOKEN_RATES
from llm_budgets.results import ModelMatch, PriceResult
from llm_budgets.usage import usage_validate

# "The price version in effect at a time": started by then and not ended, the newest such
# wins. Spelled here only, as an ORM filter and as SQL text; tests/test_rule_parity.py checks
# the two agree and that no other module spells the rule again.
_NEWEST_FIRST = "-effective_from"


def _started_not_ended_q(at: datetime) -> Q:
    return Q(effective_from__lte=at) & (Q(effective_to__isnull=True) | Q(effective_to__gt=at))


def _started_not_ended_sql(alias: str, at: str = "%s") -> str:
    """SQL form of ``_started_not_ended_q``; ``at``: the time, an SQL expression used twice
    (by default a parameter, given twice)."""
    starts, ends = sql.column(Price, "effective_from"), sql.column(Price, "effective_to")
    return f"{alias}.{starts} <= {at} AND ({alias}.{ends} IS NULL OR {alias}.{ends} > {at})"


def _newest_first_sql(alias: str) -> str:
    return f"{alias}.{sql.column(Price, _NEWEST_FIRST.lstrip('-'))} DESC"


def prices_in_effect(at: datetime) -> QuerySet[Price]:
    """Versions that have started by ``at`` and not ended (older ones may be superseded)."""
    return Price.objects.filter(_started_not_ended_q(at))


def current_versions(at: datetime) -> QuerySet[Price]:
    """The version in effect at ``at`` for each (provider, model): the newest started one."""
    newest = (
        prices_in_effect(at)
        .filter(provider=OuterRef("provider"), model=OuterRef("model"))
        .order_by(_NEWEST_FIRST)
        .values("pk")[:1]
    )
    return Price.objects.filter(pk=Subquery(newest))


def price_in_effect(*, provider: str | None, model: str, at: datetime) -> Price:
    """The newest version that has started by ``at`` and not ended; ``UnknownPrice`` if none.

    Without a provider, the model must be priced by exactly one provider. A name without a price
    of its own is resolved as :mod:`llm_budgets.pricing.model_names` says (spellings, genai-prices'
    matching rules, admin aliases); a known exact name costs one statement, as before.
    """
    return price_match(provider=provider, model=model, at=at)[0]


def price_match(*, provider: str | None, model: str, at: datetime) -> tuple[Price, ModelMatch]:
    """``price_in_effect`` and how the name found it (which rule of ``model_names``)."""
    price = _exact_version(provider, model, at)
    if price is not None:
        return price, ModelMatch(model, price.provider, model, model_names.EXACT)
    found = model_names.price_for_name(
        provider=provider, model=model, lookup=lambda p, m: _exact_version(p, m, at)
    )
    if found is None:
        raise UnknownPrice(provider=provider, model=model)
    return found


def _exact_version(provider: str | None, model: str, at: datetime) -> Price | None:
    if provider is not None:
        # Every admission asks this: one statement without the ORM's compilation.
        when = sql.param(Price, "effective_from", at)
        rows = sql.fetch(version_in_effect_sql(), [provider, model, when, when])
        return sql.row_to(Price, rows[0]) if rows else None
    versions = prices_in_effect(at).filter(model=model)
    providers = sorted(set(versions.values_list("provider", flat=True)))
    if len(providers) > 1:
        raise InvalidUsage(
            f"{model} is priced by several providers ({', '.join(providers)}): "
            "pass provider= to say which one serves the call.",
            field="provider",
        )
    return versions.order_by(_NEWEST_FIRST).first()


@functools.cache
def version_in_effect_sql(columns: str = "*", at: str = "%s") -> str:
    """``price_in_effect`` for a given provider, selecting ``columns`` of version ``v`` (``*``:
    all, for ``statements.row_to``). Parameters: provider, model, the time twice (unless ``at``,
    the time's SQL expression, is not a parameter)."""
    selected = sql.columns(Price, "v") if columns == "*" else f"v.{sql.quote(columns)}"
    return (
        f"SELECT {selected} FROM {sql.table(Price)} v"  # noqa: S608
        f" WHERE v.{sql.column(Price, 'provider')} = %s AND v.{sql.column(Price, 'model')} = %s"
        f" AND {_started_not_ended_sql('v', at)}"
        f" ORDER BY {_newest_first_sql('v')} LIMIT 1"
    )


def worst_case(
    price: Price,
    *,
    input_tokens: int,
    max_output_tokens: int,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Decimal:
    """The hold for a request (keyword form of ``costs.worst_case``; the window defaults to
    now, which matters only for time-of-day prices)."""
    start = start or timezone.now()
    return costs.worst_case(
        price,
        input_tokens=input_tokens,
        max_output_tokens=max_output_tokens,
        start=start,
        end=end or start,
    )


def actual_cost(
    price: Price,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
    at: datetime | None = None,
) -> Decimal:
    """What usage costs at ``price`` (keyword form of ``costs.actual_cost``; the counts follow
    the convention of ``llm_budgets.usage``)."""
    usage = usage_validate(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        cache_write_tokens=cache_write_tokens,
        reasoning_tokens=reasoning_tokens,
    )
    return costs.actual_cost(price, usage, at=at or timezone.now())


@dataclass(frozen=True)
class Pricing:
    """How a request is priced: a price version, or the plan's fixed amount (``price`` None)."""

    price: Price | None
    basis: str
    fixed_amount: Decimal | None = None


def pricing_for_request(
    *,
    plan: Plan | None,
    provider: str | None,
    model: str,
    at: datetime,
    in_effect: Price | None = None,
) -> Pricing:
    """The model's price in effect, else what the plan's unknown-model policy says. Never zero:
    the default policy refuses with ``UnknownPrice``. ``in_effect``: the version in effect at
    ``at``, when the caller has already read it."""
    if in_effect is not None:
        return Pricing(in_effect, PricingBasis.PRICE)
    try:
        return Pricing(price_in_effect(provider=provider, model=model, at=at), PricingBasis.PRICE)
    except UnknownPrice as unknown:
        policy = plan.unknown_model_policy if plan else UnknownModelPolicy.REFUSE
        if plan is not None and policy == UnknownModelPolicy.RESERVE_FIXED:
            return Pricing(None, PricingBasis.FIXED, plan.unknown_model_fixed_amount)
        if plan is not None and policy == UnknownModelPolicy.PRICE_AS:
            try:
                price = price_in_effect(
                    provider=plan.unknown_model_price_as_provider,
                    model=plan.unknown_model_price_as_model,
                    at=at,
                )
            except UnknownPrice:
                raise UnknownPrice(
                    provider=provider,
                    model=model,
                    policy=f"price_as {plan.unknown_model_price_as_provider}/"
                    f"{plan.unknown_model_price_as_model}, which has no price either",
                ) from None
            return Pricing(price, PricingBasis.PRICE_AS)
        raise unknown


def output_ceiling(*, requested: int | None, plan: Plan | None, price: Price | None) -> int | None:
    """The output ceiling of a request: the one asked for, else the plan's default, clamped to
    the model's known maximum (its ``max_output_tokens``, else its context window). None when
    there is neither (the caller refuses with ``OutputCeilingRequired``)."""
    ceiling = requested
    if ceiling is None and plan is not None:
        ceiling = plan.default_max_output_tokens
    if ceiling is None or price is None:
        return ceiling
    known = price.max_output_tokens or price.context_window
    return min(ceiling, known) if known else ceiling


def price_is_referenced(price: Price) -> bool:
    """Whether a reservation or ledger line uses the version (then it is never edited)."""
    return (
        Reservation.objects.filter(price=price).exists()
        or UsageRecord.objects.filter(price=price).exists()
    )


# The fields a version prices with: what a new version states and what the sync compares.
PRICE_FIELDS = (
    *TOKEN_RATES,
    "per_request",
    "tool_fees",
    "tiers",
    "service_tiers",
    "daily_spans",
    "max_output_tokens",
    "context_window",
)
_REQUIRED_RATES = ("input_per_mtok", "output_per_mtok")


def _rate(field: str, value: object, *, allow_none: bool = False) -> Decimal | None:
    """A non-negative rate that every database stores exactly: at most ``RATE_DECIMAL_PLACES``
    decimals and ``RATE_SIGNIFICANT_DIGITS`` significant digits (nothing is rounded away
    silently)."""
    places = RATE_DECIMAL_PLACES
    rate = (
        validation.optional_money(field, value, places=places)
        if allow_none
        else validation.money(field, value, places=places)
    )
    if rate is not None and (
        rate != rate.quantize(RATE_QUANTUM)
        or len(rate.normalize().as_tuple().digits) > RATE_SIGNIFICANT_DIGITS
    ):
        raise InvalidUsage(
            f"{field}={rate} has more than {RATE_DECIMAL_PLACES} decimal places or "
            f"{RATE_SIGNIFICANT_DIGITS} significant digits.",
            field=field,
        )
    return rate


def _rate_map(field: str, value: object, *, names: tuple[str, ...]) -> dict[str, str | None]:
    if not isinstance(value, Mapping):
        raise InvalidUsage(f"{field} must be a mapping of rates.", field=field)
    unknown = set(value) - set(names)
    if unknown:
        raise InvalidUsage(
            f"{field} has unknown keys {sorted(unknown)}; known: {', '.join(names)}.", field=field
        )
    result = {}
    for key, rate in value.items():
        amount = _rate(f"{field}.{key}", rate, allow_none=True)
        result[key] = None if amount is None else plain(amount)
    return result


def _tiers(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list | tuple):
        raise InvalidUsage("tiers must be a list.", field="tiers")
    tiers = []
    previous = -1
    for tier in value:
        if not isinstance(tier, Mapping) or set(tier) != {"above_input_tokens", "prices"}:
            raise InvalidUsage(
                'each tier is {"above_input_tokens": N, "prices": {...}}.', field="tiers"
            )
        above = validation.token_count("tiers.above_input_tokens", tier["above_input_tokens"])
        if above <= previous:
            raise InvalidUsage("tiers must be in ascending above_input_tokens.", field="tiers")
        previous = above
        tiers.append(
            {
                "above_input_tokens": above,
                "prices": _rate_map("tiers.prices", tier["prices"], names=TOKEN_RATES),
            }
        )
    return tiers


def _service_tiers(value: object) -> dict[str, dict[str, str | None]]:
    if not isinstance(value, Mapping):
        raise InvalidUsage(
            'service_tiers must map a tier name to its rates: {"priority": {...}}.',
            field="service_tiers",
        )
    return {
        validation.identifier("service_tiers", name, max_length=32): _rate_map(
            "service_tiers.prices", prices, names=TOKEN_RATES
        )
        for name, prices in value.items()
    }


def _spans(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list | tuple):
        raise InvalidUsage("daily_spans must be a list.", field="daily_spans")
    spans = []
    for span in value:
        if not isinstance(span, Mapping) or set(span) != {"start", "end", "prices"}:
            raise InvalidUsage(
                'each daily span is {"start": "HH:MM", "end": "HH:MM", "prices": {...}} (UTC).',
                field="daily_spans",
            )
        try:
            start, end = time.fromisoformat(span["start"]), time.fromisoformat(span["end"])
        except (TypeError, ValueError):
            raise InvalidUsage(
                f"daily span times must be HH:MM[:SS], got {span['start']!r}-{span['end']!r}.",
                field="daily_spans",
            ) from None
        if start == end or start.tzinfo or end.tzinfo:
            raise InvalidUsage(
                "a daily span needs distinct start and end times, in UTC without offset.",
                field="daily_spans",
            )
        spans.append(
            {
                "start": start.isoformat(),
                "end": end.isoformat(),
                "prices": _rate_map("daily_spans.prices", span["prices"], names=TOKEN_RATES),
            }
        )
    return spans


def _optional_count(field: str, value: object) -> int | None:
    if value is None:
        return None
    return validation.token_count(field, value, allow_zero=False)


def price_values(**given: object) -> dict[str, Any]:
    """Validate the fields of a version (``PRICE_FIELDS``); ``InvalidUsage`` names the field."""
    unknown = set(given) - set(PRICE_FIELDS)
    if unknown:
        raise InvalidUsage(f"unknown price fields {sorted(unknown)}.", field=sorted(unknown)[0])
    values: dict[str, Any] = {}
    for name in TOKEN_RATES:
        values[name] = _rate(name, given.get(name), allow_none=name not in _REQUIRED_RATES)
    values["per_request"] = _rate("per_request", given.get("per_request") or 0)
    fees = given.get("tool_fees") or {}
    names = tuple(fees) if isinstance(fees, Mapping) else ()
    values["tool_fees"] = {
        validation.identifier("tool_fees", name, max_length=64): fee
        for name, fee in _rate_map("tool_fees", fees, names=names).items()
        if fee is not None
    }
    values["tiers"] = _tiers(given.get("tiers") or [])
    values["service_tiers"] = _service_tiers(given.get("service_tiers") or {})
    values["daily_spans"] = _spans(given.get("daily_spans") or [])
    values["max_output_tokens"] = _optional_count(
        "max_output_tokens", given.get("max_output_tokens")
    )
    values["context_window"] = _optional_count("context_window", given.get("context_window"))
    return values


def plain(value: Decimal) -> str:
    """An amount without trailing zeros or exponent: ``2.5``, ``100``."""
    return format(value.normalize(), "f")


def comparable(values: Mapping[str, Any]) -> dict[str, Any]:
    """Pricing fields with amounts as plain strings, so stored and fresh values compare equal."""
    return {
        key: plain(value) if isinstance(value, Decimal) else value for key, value in values.items()
    }


def price_snapshot(price: Price) -> dict[str, Any]:
    """A version's pricing fields as JSON-friendly values (for comparing and auditing)."""
    return comparable({name: getattr(price, name) for name in PRICE_FIELDS})


def price_set(
    *,
    provider: str,
    model: str,
    effective_from: datetime | None = None,
    source: str = PriceSource.MANUAL,
    source_detail: str = "",
    actor: str = "",
    reason: str = "",
    **fields: object,
) -> Price:
    """Add a price version (``fields``: see ``PRICE_FIELDS``). Existing versions are never
    edited; the newest started one wins."""
    provider = validation.identifier("provider", provider, max_length=64)
    model = validation.identifier("model", model, max_length=128)
    if effective_from is not None and timezone.is_naive(effective_from):
        raise InvalidUsage("effective_from must be timezone-aware.", field="effective_from")
    starts = effective_from or timezone.now()
    values = price_values(**fields)
    with transaction.atomic():
        if Price.objects.filter(provider=provider, model=model, effective_from=starts).exists():
            raise InvalidUsage(
                f"{provider}/{model} already has a version starting at "
                f"{starts.isoformat()}; versions are never edited, "
                "give the new one a later effective_from.",
                field="effective_from",
            )
        price = Price.objects.create(
            provider=provider,
            model=model,
            currency=conf.CURRENCY,
            effective_from=starts,
            source=source,
            source_detail=source_detail,
            **values,
        )
        audit_price(price, action="price.set", actor=actor, reason=reason)
    return price


def price_result(price: Price) -> PriceResult:
    """A price version as the public API returns it (``set_price``, ``quote``): the one
    builder of :class:`~llm_budgets.results.PriceResult`."""
    return PriceResult(
        id=price.pk,
        provider=price.provider,
        model=price.model,
        input_per_mtok=price.input_per_mtok,
        output_per_mtok=price.output_per_mtok,
        currency=price.currency,
        effective_from=price.effective_from,
        effective_to=price.effective_to,
        cached_input_per_mtok=price.cached_input_per_mtok,
        cache_write_per_mtok=price.cache_write_per_mtok,
        per_request=price.per_request,
        source=str(price.source),
    )


def audit_price(
    price: Price,
    *,
    action: str,
    actor: str = "",
    reason: str = "",
    before: dict[str, Any] | None = None,
) -> None:
    AuditEvent.objects.create(
        action=action,
        actor=actor,
        target=f"price {price.provider}/{price.model} from {price.effective_from.isoformat()}",
        before=before,
        after={"id": price.pk, "source": price.source, **price_snapshot(price)},
        reason=reason,
    )
