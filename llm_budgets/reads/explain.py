"""``explain``: every budget and kill switch that applies to a would-be request, with its state.

Built on :func:`llm_budgets.reads.quotes.quote` (the itemised worst case and every budget it would
draw on) plus the open kill switches that cover the request. A read: nothing is held, created or
recorded. Returned as :class:`llm_budgets.results.Explanation` (plain data, no model).
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from llm_budgets.control.killswitches import kill_switches_covering
from llm_budgets.models import EndUser
from llm_budgets.reads.quotes import request_quote
from llm_budgets.request import Request
from llm_budgets.results import Explanation, SwitchState
from llm_budgets.tenancy.tenants import tenant_get

__all__ = ["Explanation", "SwitchState", "request_explain"]


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
