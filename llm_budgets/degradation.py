"""The degradation ladder: a plan's rungs that serve a request more cheaply as its budgets fill.

A plan's ``degradation_ladder`` is a list of rungs, each applying from ``at_percent`` of the
most-used budget that covers the request (spent + reserved over the limit, raises included):

    [{"at_percent": 80, "models": {"gpt-4o": "gpt-4o-mini"}},
     {"at_percent": 95, "max_output_tokens": 256}]

Rungs are cumulative: at 96 % both apply. The model substitute is served by the same provider.
At 100 % the budget itself refuses. A degraded request is admitted against the same budgets with
its new worst case, in the same locked transaction: never a separate allowance. Only requests that
pass ``allow_degrade=True`` are degraded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from llm_budgets.exceptions import InvalidUsage

HUNDRED = Decimal(100)


@dataclass(frozen=True)
class Rung:
    at_percent: Decimal
    models: dict[str, str] = field(default_factory=dict)
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class Effect:
    """What the rungs in force do to one request."""

    model: str
    max_output_tokens: int

    def changes(self, model: str, max_output_tokens: int) -> bool:
        return self.model != model or self.max_output_tokens != max_output_tokens


def ladder_parse(value: object) -> list[Rung]:
    """Validate a plan's ladder; ``InvalidUsage`` (field ``degradation_ladder``) says why not."""
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise _bad("must be a list of rungs")
    rungs = []
    for index, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise _bad(f"rung {index} must be an object")
        unknown = set(raw) - {"at_percent", "models", "max_output_tokens"}
        if unknown:
            raise _bad(f"rung {index} has unknown keys {sorted(unknown)}")
        try:
            at = Decimal(str(raw.get("at_percent")))
        except InvalidOperation:
            raise _bad(f"rung {index}: at_percent must be a number") from None
        if isinstance(raw.get("at_percent"), bool) or not at.is_finite() or not 0 < at < HUNDRED:
            raise _bad(f"rung {index}: at_percent must be above 0 and below 100")
        models = raw.get("models", {})
        if not isinstance(models, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in models.items()
        ):
            raise _bad(f"rung {index}: models must map model names to model names")
        ceiling = raw.get("max_output_tokens")
        if ceiling is not None and (
            isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 1
        ):
            raise _bad(f"rung {index}: max_output_tokens must be a positive whole number")
        if not models and ceiling is None:
            raise _bad(f"rung {index} does nothing: give models or max_output_tokens")
        rungs.append(Rung(at_percent=at, models=dict(models), max_output_tokens=ceiling))
    return sorted(rungs, key=lambda r: r.at_percent)


def _bad(what: str) -> InvalidUsage:
    return InvalidUsage(f"degradation_ladder {what}.", field="degradation_ladder")


def substitutes(rungs: Iterable[Rung], model: str) -> set[str]:
    """Every model ``model`` might be served as (to check kill switches up front)."""
    return {r.models[model] for r in rungs if model in r.models}


def effect_at(
    rungs: Iterable[Rung], used_percent: Decimal, *, model: str, max_output_tokens: int
) -> Effect:
    """The rungs in force at ``used_percent`` applied to a request, lowest rung first."""
    for rung in rungs:
        if rung.at_percent > used_percent:
            break
        model = rung.models.get(model, model)
        if rung.max_output_tokens is not None:
            max_output_tokens = min(max_output_tokens, rung.max_output_tokens)
    return Effect(model=model, max_output_tokens=max_output_tokens)


def used_percent(pairs: Iterable[tuple[Decimal, Decimal]]) -> Decimal:
    """The most-used budget's share in percent, from (spent + reserved, limit) pairs."""
    worst = Decimal(0)
    for used, limit in pairs:
        share = HUNDRED if limit <= 0 else used * HUNDRED / limit
        worst = max(worst, share)
    return worst
