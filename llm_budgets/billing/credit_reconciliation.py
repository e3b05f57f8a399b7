"""Prepaid reconciliation: the ledger's balances, their top-ups, and Stripe's credit grants and
credit balance summaries agree, to the minor unit (the cent). Reads only; the daily job
(``llm_budgets.credits_daily``) and ``manage.py llm_budgets_credits_reconcile`` report.

Checked per balance:

- its limit is the sum of its lots' live parts (the ledger against itself);
- every credited top-up has its lot, of its amount, and every top-up lot a credited top-up;
- for a linked tenant, what is live on both sides: each lot's live part (``amount`` less what
  was taken back, removed or expired: ``amount - forfeited``) equals what Stripe applied from its
  voided grants (``stripe_applied``) plus its live grant, of its category; an expired lot's grant
  is expired or voided in Stripe too; and Stripe has no live grant of ours (metadata
  ``llmb_top_up`` / ``llmb_lot``) the ledger does not know;
- Stripe's available credit (summary, metered scope) is at most what the ledger keeps live in
  the grants (the lots' live parts less what Stripe already applied): both figures are reported
  (they differ by usage not yet invoiced), and a Stripe balance above it is a difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.utils import timezone

from llm_budgets.billing.client import stripe_client
from llm_budgets.billing.credits import balance_state, from_minor_units
from llm_budgets.billing.topups import METADATA_KEY, mirrored
from llm_budgets.models import (
    CreditAccount,
    CreditLot,
    LotSource,
    StripeCustomerLink,
    TopUp,
    TopUpState,
)
from llm_budgets.money import display

# Lots that Stripe should mirror as credit grants (an adjustment is the ledger's alone).
STRIPE_SOURCES = (LotSource.TOP_UP, LotSource.RECHARGE, LotSource.GRANT)


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
    now = timezone.now().timestamp()
    grants = _ours(client, link.customer_id)
    kept = Decimal(0)  # what the live grants should still hold, by the ledger
    for lot in lots:
        if not mirrored(lot) and lot.source not in STRIPE_SOURCES:
            continue
        grant = grants.pop(lot.stripe_grant_id, None) if lot.stripe_grant_id else None
        live = lot.amount - lot.forfeited
        if lot.expired_at is not None:
            if grant is not None and not _expired(grant, now):
                report.differences.append(
                    f"lot {lot.pk} expired but its Stripe grant {grant['id']} is still live"
                )
            continue
        if not mirrored(lot):
            report.differences.append(
                f"lot {lot.pk} ({display(lot.amount)} {cur}) has no live Stripe credit grant"
            )
            continue
        granted = Decimal(0)
        if grant is not None:
            granted = from_minor_units(grant["amount"]["monetary"]["value"], cur)
            if grant["category"] != lot.kind:
                report.differences.append(
                    f"lot {lot.pk} is {lot.kind}; grant {grant['id']} is {grant['category']}"
                )
        kept += max(Decimal(0), live - lot.stripe_applied)
        if grant is None and lot.stripe_grant_id:
            report.differences.append(
                f"lot {lot.pk} ({display(live)} {cur} live) has no live Stripe credit grant "
                f"({lot.stripe_grant_id} is voided or unknown)"
            )
        elif lot.stripe_applied + granted != live:
            report.differences.append(
                f"lot {lot.pk} has {display(live)} {cur} live (amount {display(lot.amount)}, "
                f"{display(lot.forfeited)} taken back, removed or expired) but Stripe "
                f"{display(lot.stripe_applied + granted)} (applied {display(lot.stripe_applied)}"
                f" from voided grants, grant {grant['id'] if grant else 'none'} of "
                f"{display(granted)})"
            )
    for grant in grants.values():
        if _expired(grant, now):
            continue
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
    if available > kept:
        report.differences.append(
            f"Stripe's available credit {display(available)} {cur} is more than the "
            f"{display(kept)} the ledger keeps live in its grants"
        )
    return report


def _expired(grant: dict[str, Any], now: float) -> bool:
    return grant.get("expires_at") is not None and grant["expires_at"] <= now


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


def reports_written(write: Callable[[str], object], reports: list[BalanceReport]) -> int:
    """Write each balance's line and its differences (the commands' output); returns how many
    differences."""
    bad = 0
    for report in reports:
        stripe = (
            ""
            if report.stripe_available is None
            else f", Stripe available {display(report.stripe_available)}"
        )
        write(
            f"{report.tenant}: credit {display(report.credit)}, available "
            f"{display(report.available)}{stripe}: "
            + ("clean" if not report.differences else f"{len(report.differences)} difference(s)")
        )
        for difference in report.differences:
            write(f"  {difference}")
        bad += len(report.differences)
    return bad
