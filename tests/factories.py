"""Fixture builders. Prices are chosen so that amounts are easy to reason about."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from llm_budgets import budgets
from llm_budgets.models import Price

# One output token of "fake/m30" costs 0.03: max_output_tokens=1000 holds exactly 30.
FAKE_PROVIDER = "fake"
FAKE_MODEL = "m30"
# Tests move the clock through the past; the fixture price is in effect for all of it.
PRICES_START = datetime(2020, 1, 1, tzinfo=UTC)


def price_fake(*, effective_from: datetime | None = None, output_per_mtok: str = "30000") -> None:
    budgets.set_price(
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_per_mtok=Decimal("0"),
        output_per_mtok=Decimal(output_per_mtok),
        effective_from=effective_from or PRICES_START,
    )


def seed(*, limit: str = "100", tenant: str = "acme", window: str = "month") -> None:
    """The seed scenario: one tenant capped at ``limit``; each call's worst case is 30."""
    if not Price.objects.filter(provider=FAKE_PROVIDER, model=FAKE_MODEL).exists():
        price_fake()
    budgets.ensure_tenant(tenant=tenant, name=tenant.title())
    budgets.set_limit(tenant=tenant, amount=Decimal(limit), window=window)


def reserve_30(
    *,
    tenant: str = "acme",
    end_user: str | None = None,
    max_output_tokens: int = 1000,
    provider: str | None = FAKE_PROVIDER,
    **kwargs: object,
) -> budgets.Hold:
    return budgets.reserve(
        tenant=tenant,
        end_user=end_user,
        provider=provider,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=max_output_tokens,
        **kwargs,  # type: ignore[arg-type]
    )


def billing_contacts(emails: str, *, tenant: str = "acme") -> None:
    budgets.ensure_tenant(tenant=tenant, billing_emails=emails)


def reserve_30_at(
    at: datetime, *, tenant: str = "acme", ttl: int = 120, **scopes: object
) -> object:
    """A hold of 30 taken at ``at`` (admission's clock), e.g. to make it overdue already;
    ``scopes``: ``run=`` and ``tags=``, if any."""
    from llm_budgets.engine.admission import reservation_create

    return reservation_create(
        tenant=tenant,
        provider=FAKE_PROVIDER,
        model=FAKE_MODEL,
        input_tokens=0,
        max_output_tokens=1000,
        ttl=ttl,
        now=at,
        **scopes,  # type: ignore[arg-type]
    )
