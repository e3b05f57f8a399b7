"""The prepaid balances' daily job (task ``llm_budgets.credits_daily``, command
``llm_budgets_credits_daily``, :func:`credits_daily`): expire the credit lots that are due; with
Stripe configured, bring the Stripe grants of lots whose live part changed into step, then
reconcile each balance with Stripe."""

from __future__ import annotations

from llm_budgets.billing.credit_reconciliation import BalanceReport, credits_reconcile
from llm_budgets.billing.credits import credits_expire
from llm_budgets.billing.topups import grants_follow
from llm_budgets.conf import conf


def credits_daily() -> list[BalanceReport]:
    """Run the job; returns the reconciliation's reports (none without ``STRIPE_API_KEY``: the
    lots still expire)."""
    credits_expire()
    if not conf.STRIPE_API_KEY:
        return []
    grants_follow()
    return credits_reconcile()
