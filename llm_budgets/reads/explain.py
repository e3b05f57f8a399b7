"""``explain``: every budget and kill switch that applies to a would-be request, with its state.

Built on :func:`llm_budgets.reads.quotes.quote` (the itemised worst case and every budget it would
draw on) plus the open kill switches that cover the request. A read: nothing is held, created or
recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from llm_budgets.control.killswitches import kill_switches_covering
from llm_budgets.models import EndUser
from llm_budgets.reads.quotes import BudgetDraw, Quote, request_quote
from llm_budgets.request import Request
from llm_budgets.tenancy.tenants import tenant_get


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
class Explanation:
    quote: Quote
    switches: list[SwitchState]

    @property
    def budgets(self) -> list[BudgetDraw]:
        """Every budget that applies: its status now, what the request would hold, ``fits``."""
        return self.quote.budgets

    @property
    def amount(self) -> Decimal:
        """The worst case admission would hold (provider cost)."""
        return self.quote.estimate.amount

    @property
    def would_admit(self) -> bool:
        """Whether admission would admit it now (without degradation)."""
        return self.quote.admissible and not self.switches


def request_explain(call: Request, *, now: datetime | None = None) -> Explanation:
    """Every budget and kill switch that applies to the call ``call`` describes (checked as
    admission checks it), with its state. Reads only."""
    request = call.checked()
    assert request.tenant is not None  # checked
    now = now or timezone.now()
    result = request_quote(request, now=now)
    tenant, end_user, provider, model = (
        request.tenant,
        request.end_user,
        request.provider,
        request.model,
    )
    tenant_obj = tenant_get(tenant)
    user = (
        EndUser.objects.filter(tenant=tenant_obj, external_id=end_user).first()
        if end_user is not None
        else None
    )
    switches = kill_switches_covering(
        tenant_id=tenant_obj.pk,
        end_user_id=user.pk if user is not None else None,
        provider=result.provider or provider or "",
        models=[model],
        now=now,
    )
    return Explanation(
        quote=result,
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
