"""``explain``: every budget and kill switch that applies to a would-be request, with its state.

A read: nothing is held, created or recorded (an unseen end user is shown with the defaults it
would get).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from llm_budgets import validation
from llm_budgets.exceptions import OutputCeilingRequired
from llm_budgets.killswitches import kill_switches_covering
from llm_budgets.models import EndUser
from llm_budgets.pricing import price_in_effect, worst_case
from llm_budgets.selectors import BudgetStatus, budget_statuses
from llm_budgets.tenants import tenant_get


@dataclass(frozen=True)
class SwitchState:
    switch_id: int
    scope: str
    reason: str
    tripped_by: str
    tripped_at: datetime
    automatic: bool
    auto_clear_at: datetime | None


@dataclass(frozen=True)
class BudgetVerdict:
    status: BudgetStatus
    fits: bool  # the request's worst case fits in what remains


@dataclass(frozen=True)
class Explanation:
    tenant: str
    end_user: str | None
    provider: str
    model: str
    amount: Decimal  # the worst case admission would hold
    currency: str
    budgets: list[BudgetVerdict]
    switches: list[SwitchState]

    @property
    def would_admit(self) -> bool:
        """Whether admission would admit it now (without degradation)."""
        return bool(self.budgets) and not self.switches and all(b.fits for b in self.budgets)


def request_explain(
    *,
    tenant: object,
    model: object,
    input_tokens: object,
    max_output_tokens: object = None,
    end_user: object = None,
    provider: object = None,
    now: datetime | None = None,
) -> Explanation:
    now = now or timezone.now()
    tenant_obj = tenant_get(validation.identifier("tenant", tenant))
    model_name = validation.identifier("model", model, max_length=128)
    tokens_in = validation.token_count("input_tokens", input_tokens)
    ceiling = (
        None
        if max_output_tokens is None
        else validation.token_count("max_output_tokens", max_output_tokens, allow_zero=False)
    )
    if ceiling is None:
        ceiling = tenant_obj.plan.default_max_output_tokens if tenant_obj.plan else None
        if ceiling is None:
            raise OutputCeilingRequired()
    price = price_in_effect(
        provider=None
        if provider is None
        else validation.identifier("provider", provider, max_length=64),
        model=model_name,
        at=now,
    )
    amount = worst_case(price, input_tokens=tokens_in, max_output_tokens=ceiling)
    user_obj = None
    user_id = None
    if end_user is not None:
        user_id = validation.identifier("end_user", end_user)
        user_obj = tenant_obj.end_users.filter(external_id=user_id).first() or EndUser(
            tenant=tenant_obj, external_id=user_id
        )
    statuses = budget_statuses(tenant_obj, user_obj, now)
    switches = kill_switches_covering(
        tenant_id=tenant_obj.pk,
        end_user_id=user_obj.pk if user_obj is not None else None,
        provider=price.provider,
        models=[model_name],
        now=now,
    )
    return Explanation(
        tenant=tenant_obj.external_id,
        end_user=user_id,
        provider=price.provider,
        model=model_name,
        amount=amount,
        currency=price.currency,
        budgets=[BudgetVerdict(s, amount <= s.limit - s.spent - s.reserved) for s in statuses],
        switches=[
            SwitchState(
                switch_id=s.pk,
                scope=s.scope_label,
                reason=s.reason,
                tripped_by=s.tripped_by,
                tripped_at=s.tripped_at,
                automatic=s.automatic,
                auto_clear_at=s.auto_clear_at,
            )
            for s in switches
        ],
    )
