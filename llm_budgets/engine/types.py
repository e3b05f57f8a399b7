"""The engine's own types: which counter row a budget draws on (:class:`CounterKey`), a budget
that applies to a call (:class:`ApplicableBudget`), and what a call names beyond its tenant and end
user (:class:`CallScopes`). Pure values: the reads and locks live in ``engine.counters`` and
``engine.applicable``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from llm_budgets.models import ApiKey, Budget, Counter, EndUser, Run
from llm_budgets.windows import Period

# The dimensions that split a budget's counter, in ``CounterKey`` order (between the budget and
# the period start): Counter foreign keys, NULL where the budget is not split by them.
DIMENSIONS: tuple[str, ...] = ("end_user", "run", "api_key")


class CounterKey(NamedTuple):
    """Which counter row a budget draws on: ``(budget, end user, run, API key, period start)``,
    each dimension None unless the budget is the ``"*"`` budget split by it."""

    budget_id: int
    end_user_id: int | None
    run_id: int | None
    api_key_id: str | None
    period_start: datetime

    @classmethod
    def of(cls, counter: Counter) -> CounterKey:
        """The key of a counter row."""
        dimensions = [getattr(counter, f"{d}_id") for d in DIMENSIONS]
        return cls._make([counter.budget_id, *dimensions, counter.period_start])

    @property
    def series(self) -> tuple[Any, ...]:
        """The key without its period: every bucket of a rolling budget shares it."""
        return tuple(self[:-1])

    def counter(self, stripe: int = 0) -> Counter:
        """A new, unsaved counter row for this key (one stripe of it, for a hot budget)."""
        ids = {f"{d}_id": v for d, v in zip(DIMENSIONS, self[1:-1], strict=True)}
        return Counter(
            budget_id=self.budget_id, period_start=self.period_start, stripe=stripe, **ids
        )


@dataclass(frozen=True)
class ApplicableBudget:
    budget: Budget
    period: Period
    # For an each-end-user (``"*"``) budget: the end user whose own counter it draws on.
    end_user: EndUser | None = None

    @property
    def counter_key(self) -> CounterKey:
        """The counter row this budget draws on (``engine.counters`` defines the key)."""
        return CounterKey(
            self.budget.pk,
            self.end_user.pk if self.end_user else None,
            self.run.pk if self.run else None,
            self.api_key.pk if self.api_key else None,
            self.period.start,
        )

    raised: Decimal = Decimal(0)  # active temporary raises (BudgetRaise) at the time asked
    # For an each-run or each-API-key (``"*"``) budget: the run or key whose counter it draws on.
    run: Run | None = None
    api_key: ApiKey | None = None

    @property
    def scope_label(self) -> str:
        """The scope as a person reads it, naming the run or key of a ``"*"`` budget's share:
        ``run run-42 of acme``, ``API key Ro26JFJq``, ``tag project=alpha of acme``."""
        if self.run is not None:
            return f"run {self.run.external_id} of {self.budget.tenant.external_id}"  # type: ignore[union-attr]
        if self.api_key is not None:
            return f"API key {self.api_key.prefix}"
        return self.budget.scope_label

    @property
    def limit(self) -> Decimal:
        """The limit admission enforces: the budget's own plus its active raises."""
        return self.budget.limit + self.raised


@dataclass(frozen=True)
class CallScopes:
    """What a call names beyond its tenant and end user: its run, the API key it came through,
    its tags. Budgets of these scopes apply only to calls naming them; a call naming none adds
    nothing to admission's statement (no extra condition, parameter or row)."""

    run: Run | None = None
    api_key: ApiKey | None = None
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def shape(self) -> tuple[bool, bool, int]:
        """What the SQL condition depends on (its text is cached per shape)."""
        return (self.run is not None, self.api_key is not None, len(self.tags))

    @property
    def params(self) -> list[object]:
        """The condition's parameters, in the order ``_budgets_applying`` places them."""
        params: list[object] = []
        if self.run is not None:
            params.append(self.run.pk)
        if self.api_key is not None:
            params.append(self.api_key.pk)
        for key, value in self.tags:
            params += [key, value]
        return params


NO_SCOPES = CallScopes()
