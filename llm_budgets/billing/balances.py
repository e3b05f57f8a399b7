"""Auto-recharge of prepaid balances, triggered by the commit that crosses the threshold.

A tenant whose balance has a recharge rule ("below X, charge Y": ``CreditAccount``) gets, in the
transaction of the commit that leaves less than X available (credit - spent - held), a pending
``TopUp`` of Y: the outbox row the recharge job pays off-session (``billing/recharge.py``). The
account's ``recharge_armed`` flag is cleared by the same transaction, with a conditional UPDATE
that concurrent commits serialise on: one row per crossing, however many commits cross at once.
A credited top-up that lifts the balance back to X or more arms it again (``billing/credits``).

Tenants without a rule pay nothing: each process keeps the set of tenants with one, re-read at
most every 30 seconds (as ``billing.outbox`` keeps the linked tenants); a rule set in
another process applies here within that long.
"""

from __future__ import annotations

from datetime import datetime

from llm_budgets.db.cached import CachedSet
from llm_budgets.models import Counter, CreditAccount, TopUp, TopUpKind
from llm_budgets.windows import LIFETIME_START

# Tenants with a recharge rule, re-read at most every 30 seconds per process.
RULES = CachedSet(
    30.0,
    lambda: CreditAccount.objects.filter(recharge_below__isnull=False).values_list(
        "tenant_id", flat=True
    ),
)


def tenant_may_recharge(tenant_id: int) -> bool:
    return tenant_id in RULES.get()


def recharge_rules_clear() -> None:
    """Forget the cached rules (this process re-reads them on its next commit)."""
    RULES.clear()


def recharge_trigger(tenant_id: int, now: datetime) -> TopUp | None:
    """In the committing transaction, after its counters moved (and while they are locked): the
    recharge row if this commit left the balance below its threshold and the rule is armed."""
    account = (
        CreditAccount.objects.filter(
            tenant_id=tenant_id, recharge_armed=True, recharge_below__isnull=False
        )
        .select_related("budget")
        .first()
    )
    if account is None or account.recharge_below is None or account.recharge_amount is None:
        return None
    counter = Counter.objects.filter(
        budget_id=account.budget_id,
        period_start=LIFETIME_START,
        end_user=None,
        run=None,
        api_key=None,
    ).first()
    used = (counter.spent + counter.reserved) if counter else 0
    if account.budget.limit - used >= account.recharge_below:
        return None
    # Concurrent commits wait here on the account row; only the first finds it armed.
    if not CreditAccount.objects.filter(pk=account.pk, recharge_armed=True).update(
        recharge_armed=False
    ):
        return None
    return TopUp.objects.create(
        account=account,
        kind=TopUpKind.RECHARGE,
        amount=account.recharge_amount,
        currency=account.currency,
        created_at=now,
    )
