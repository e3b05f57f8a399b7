"""Model names as they are spelled in the wild, resolved to the model whose price applies.

A request (or an SDK response) may name ``gpt-4o-2024-08-06``, ``claude-3-5-haiku-latest``,
``mistral-large-latest``, ``models/gemini-2.5-flash`` or ``openai/gpt-4o``. The price of a name is
found by the first rule that gives one, in this order:

1. **exact**: a price version for exactly that (provider, model). The admission hot path reads it
   in its one statement; a known exact name costs nothing more.
2. **spelling**: the name lower-cased, without a ``models/`` prefix (Google's SDKs) or a
   ``<provider>/`` prefix (gateways), priced exactly.
3. **genai-prices**: the bundled catalogue's own matching rules (``genai_prices``: dated
   snapshots, ``-latest`` names, compact dates...), giving its model id, priced exactly. No
   network: only the bundled data is read.
4. **alias**: an admin-defined :class:`~llm_budgets.models.ModelAlias` (a name or a ``*`` pattern
   -> a priced model, per provider or for any), most specific first. Audited.

A name that matches nothing is refused (``UnknownPrice``, or the plan's unknown-model policy):
never free. The reservation and its ledger line keep the name asked for (``model``) and the price
version used (``price``); ``budgets.quote`` says which rule matched (:class:`ModelMatch`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from fnmatch import fnmatchcase

from django.db import transaction
from django.db.models import Q

from llm_budgets import validation
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import AuditEvent, ModelAlias, Price
from llm_budgets.results import ModelMatch

EXACT = "exact"
SPELLING = "spelling"
CATALOGUE = "genai-prices"
ALIAS = "alias"

Lookup = Callable[[str | None, str], Price | None]


def price_for_name(
    *, provider: str | None, model: str, lookup: Lookup
) -> tuple[Price, ModelMatch] | None:
    """The price of ``model`` by rules 2-4 (the caller has tried the exact name), or None.
    ``lookup(provider, model)``: the exact version in effect, or None."""
    for candidate_provider, candidate, rule, detail in spellings(provider, model):
        price = lookup(candidate_provider, candidate)
        if price is not None:
            return price, ModelMatch(model, price.provider, candidate, rule, detail)
    for alias in aliases_matching(provider, model):
        price = lookup(provider or alias.provider or None, alias.model)
        if price is not None:
            detail = f"alias {alias.pk}: {alias}"
            return price, ModelMatch(model, price.provider, alias.model, ALIAS, detail)
    return None


@functools.lru_cache(maxsize=4096)
def spellings(provider: str | None, model: str) -> tuple[tuple[str | None, str, str, str], ...]:
    """Rules 2 and 3 for a name: ``(provider, model, rule, detail)`` candidates in order, without
    the name itself. Pure (no database), cached."""
    found: list[tuple[str | None, str, str, str]] = []
    seen = {(provider, model)}

    def add(candidate_provider: str | None, candidate: str, rule: str, detail: str) -> None:
        if candidate and (candidate_provider, candidate) not in seen:
            seen.add((candidate_provider, candidate))
            found.append((candidate_provider, candidate, rule, detail))

    name = model.strip().lower()
    steps = []
    if name.startswith("models/"):
        name = name.removeprefix("models/")
        steps.append("without models/")
    prefix, slash, rest = name.partition("/")
    name_provider = provider
    if slash and rest and (prefix == provider or prefix in catalogue_providers()):
        name, name_provider = rest, provider or prefix
        steps.append(f"without {prefix}/")
    add(name_provider, name, SPELLING, ", ".join(steps) or "lower case")
    matched = catalogue_match(name_provider, name)
    if matched is not None:
        catalogue_provider, catalogue_model = matched
        add(
            name_provider or catalogue_provider,
            catalogue_model,
            CATALOGUE,
            f"{catalogue_provider}/{catalogue_model} in the bundled catalogue",
        )
    return tuple(found)


@functools.cache
def catalogue_providers() -> frozenset[str]:
    """The provider ids of genai-prices' bundled catalogue (empty without the package)."""
    try:
        from genai_prices.data import providers
    except ImportError:
        return frozenset()
    return frozenset(p.id for p in providers)


def catalogue_match(provider: str | None, model: str) -> tuple[str, str] | None:
    """genai-prices' own matching of a name: (its provider id, its model id), or None."""
    try:
        from genai_prices.data_snapshot import get_snapshot
    except ImportError:
        return None
    try:
        # The bundled snapshot (its updater is never started here: no network).
        found_provider, found_model = get_snapshot().find_provider_model(
            model, None, provider, None
        )
    except LookupError:
        return None
    return found_provider.id, found_model.id


def aliases_matching(provider: str | None, model: str) -> list[ModelAlias]:
    """The admin's aliases whose pattern matches ``model`` (case-insensitive), most specific
    first: this provider's before any provider's, exact names before patterns, longer patterns
    before shorter. One query."""
    scope = Q(provider="") | Q(provider=provider) if provider else Q()
    name = model.strip().lower()
    matching = [
        alias
        for alias in ModelAlias.objects.filter(scope)
        if fnmatchcase(name, alias.pattern.strip().lower())
    ]
    return sorted(
        matching,
        key=lambda a: (a.provider == "", "*" in a.pattern or "?" in a.pattern, -len(a.pattern)),
    )


def model_alias_set(
    *,
    pattern: str,
    model: str,
    provider: str = "",
    note: str = "",
    actor: str = "",
    reason: str = "",
    alias: ModelAlias | None = None,
) -> ModelAlias:
    """Add an alias (or change ``alias``): ``pattern`` (a name, or ``*`` wildcards) resolves to
    ``model``, which must have a price (of ``provider``, or of any provider when empty). Audited.
    ``InvalidUsage`` names the bad field."""
    pattern = validation.identifier("pattern", pattern, max_length=128).strip()
    model = validation.identifier("model", model, max_length=128)
    provider = (provider or "").strip()
    if provider:
        validation.identifier("provider", provider, max_length=64)
    priced = Price.objects.filter(model=model)
    if provider:
        priced = priced.filter(provider=provider)
    if not priced.exists():
        where = f"{provider}/{model}" if provider else model
        raise InvalidUsage(
            f"{where} has no price: an alias must point at a priced model (add its price "
            "first, or sync the catalogue).",
            field="model",
        )
    clash = ModelAlias.objects.filter(provider=provider, pattern=pattern)
    if alias is not None and alias.pk is not None:
        clash = clash.exclude(pk=alias.pk)
    if clash.exists():
        raise InvalidUsage(
            f"an alias for {pattern!r} ({provider or 'any provider'}) exists already; change it.",
            field="pattern",
        )
    with transaction.atomic():
        before = None
        if alias is not None and alias.pk is not None:
            old = ModelAlias.objects.select_for_update().get(pk=alias.pk)
            before = _alias_snapshot(old)
        else:
            alias = ModelAlias()
        alias.pattern, alias.provider, alias.model, alias.note = pattern, provider, model, note
        alias.save()
        AuditEvent.objects.create(
            action="model_alias.change" if before else "model_alias.add",
            actor=actor,
            target=f"model alias {alias.pk}: {alias}",
            before=before,
            after=_alias_snapshot(alias),
            reason=reason,
        )
    return alias


def model_alias_delete(alias: ModelAlias, *, actor: str = "", reason: str = "") -> None:
    """Remove an alias (calls with its names are then refused unless another rule prices them).
    Audited. Reservations and ledger lines keep the price version they used."""
    with transaction.atomic():
        AuditEvent.objects.create(
            action="model_alias.delete",
            actor=actor,
            target=f"model alias {alias.pk}: {alias}",
            before=_alias_snapshot(alias),
            reason=reason,
        )
        alias.delete()


def _alias_snapshot(alias: ModelAlias) -> dict[str, object]:
    return {
        "pattern": alias.pattern,
        "provider": alias.provider,
        "model": alias.model,
        "note": alias.note,
    }
