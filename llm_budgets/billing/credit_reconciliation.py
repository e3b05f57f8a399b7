"""Prepaid reconciliation: the ledger's balances, their top-ups, and Stripe's credit grants and
credit balance summaries agree, to the minor unit (the cent). Reads only; the daily job
(``llm_budgets.credits_daily``) and ``manage.py llm_budgets_credits_reconcile`` report.

Checked per balance:

- its limit is the sum of its lots' live parts (the ledger against itself);
- every credited top-up has its lot, of its amount, and every top-up lot a credited top-up;
- for a linked tenant: every lot mirrored to Stripe has a live grant of the same amount and
  category, and Stripe has no live grant of ours (metadata ``llmb_top_up`` / ``llmb_lot``) the
  ledger does not know;
- Stripe's available credit (summary, metered scope) is at most what its grants add up to, and at
  least the ledger's unspent credit minus what was billed and not yet invoiced: both figures are
  reported, and a Stripe balance above the grants is a difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import F, Sum

from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.credits import balance_state, from_minor_units, minor_units
from llm_budgets.billing.topups import METADATA_KEY
from llm_budgets.models import (
    CreditAccount,
    CreditLot,
    LotSource,
    StripeCustomerLink,
    TopUp,
    TopUpState,
)
from llm_budgets.money import display


@dataclass
class BalanceReport:
    tenant: str
    credit: Decimal
    available: Decimal
    stripe_available: Decimal | None = None
    differences: list[str] = field(default_factory=list)


def credits_reconcile(*, tenants: list[str] | None = None) -> list[BalanceReport]:
    """One report per balance (``tenants``: only these)."""
    accounts = CreditAccount.objects.select_related("tenant", "budget").order_by("tenant_id")
    if tenants:
        accounts = accounts.filter(tenant__external_id__in=tenants)
    return [_reconcile(account) for account in accounts]


def _reconcile(account: CreditAccount) -> BalanceReport:
    state = balance_state(account)
    report = BalanceReport(account.tenant.external_id, state.credit, state.available)
    cur = account.currency
    lots = list(CreditLot.objects.filter(account=account).select_related("top_up"))
    live = sum((lot.amount - lot.forfeited for lot in lots), Decimal(0))
    if live != state.credit:
        report.differences.append(
            f"limit {display(state.credit)} {cur} but the lots add up to {display(live)}"
        )
    credited = TopUp.objects.filter(account=account, state=TopUpState.CREDITED)
    for top_up in credited:
        lot = next((x for x in lots if x.top_up_id == top_up.pk), None)
        if lot is None or lot.amount != top_up.amount:
            report.differences.append(
                f"top-up {top_up.pk} ({display(top_up.amount)} {cur}) credited without its lot"
            )
    for lot in lots:
        if lot.source in (LotSource.TOP_UP, LotSource.RECHARGE) and (
            lot.top_up is None or lot.top_up.state != TopUpState.CREDITED
        ):
            report.differences.append(f"lot {lot.pk} has no credited top-up")
    link = StripeCustomerLink.objects.filter(
        tenant_id=account.tenant_id, unlinked_at__isnull=True
    ).first()
    if link is None:
        return report
    client = stripe_client()
    grants = _ours(client, link.customer_id)
    for lot in lots:
        if lot.source in (LotSource.TOP_UP, LotSource.RECHARGE, LotSource.GRANT):
            grant = grants.pop(lot.stripe_grant_id, None) if lot.stripe_grant_id else None
            if grant is None:
                report.differences.append(
                    f"lot {lot.pk} ({display(lot.amount)} {cur}) has no live Stripe credit grant"
                )
                continue
            value = grant["amount"]["monetary"]["value"]
            if value != minor_units(lot.amount, cur) or grant["category"] != lot.kind:
                report.differences.append(
                    f"lot {lot.pk} is {display(lot.amount)} {cur} {lot.kind}; grant "
                    f"{grant['id']} is {display(from_minor_units(value, cur))} "
                    f"{grant['category']}"
                )
    for grant in grants.values():
        value = from_minor_units(grant["amount"]["monetary"]["value"], cur)
        report.differences.append(
            f"Stripe grant {grant['id']} ({display(value)} {cur}) is unknown to the ledger"
        )
    summary = client.v1.billing.credit_balance_summary.retrieve(
        params={
            "customer": link.customer_id,
            "filter": {
                "type": "applicability_scope",
                "applicability_scope": {"price_type": "metered"},
            },
        }
    ).to_dict()
    available = sum(
        (
            from_minor_units(b["available_balance"]["monetary"]["value"], cur)
            for b in summary.get("balances") or []
            if b["available_balance"]["monetary"]["currency"] == cur.lower()
        ),
        Decimal(0),
    )
    report.stripe_available = available
    granted = CreditLot.objects.filter(account=account).exclude(stripe_grant_id="")
    total = granted.aggregate(total=Sum(F("amount")))["total"] or Decimal(0)
    if available > total:
        report.differences.append(
            f"Stripe's available credit {display(available)} {cur} is more than the "
            f"{display(total)} granted"
        )
    return report


def _ours(client: Any, customer: str) -> dict[str, dict[str, Any]]:
    """The customer's live credit grants this app made, by id."""
    found: dict[str, dict[str, Any]] = {}
    for grant in client.v1.billing.credit_grants.list(
        params={"customer": customer, "limit": 100}
    ).auto_paging_iter():
        data = grant.to_dict()
        metadata = data.get("metadata") or {}
        if data.get("voided_at") is None and (METADATA_KEY in metadata or "llmb_lot" in metadata):
            found[data["id"]] = data
    return found
