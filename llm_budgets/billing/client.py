"""The Stripe client, configured from ``LLM_BUDGETS`` (needs the ``stripe`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from llm_budgets.conf import conf

if TYPE_CHECKING:
    import stripe


# Seconds a call to Stripe may take (connect, then each read) before it is a connection error the
# outbox retries with the same identifier. The stripe package's own default is 80 s: a stalled
# Stripe held a worker that long per delivery.
TIMEOUT_SECONDS = 30.0


class StripeNotConfigured(ImproperlyConfigured):
    """Nothing can be sent: no API key, or the ``stripe`` package is missing."""


def stripe_client() -> stripe.StripeClient:
    """A client for ``STRIPE_API_BASE`` with ``STRIPE_API_KEY``. It retries nothing itself: the
    outbox retries, with the same identifier and Idempotency-Key (docs/billing.md)."""
    key = conf.STRIPE_API_KEY
    if not key:
        raise StripeNotConfigured(
            "LLM_BUDGETS['STRIPE_API_KEY'] is not set, so nothing is sent to Stripe; usage "
            "waits in the outbox. Set it (docs/billing.md)."
        )
    try:
        import stripe
    except ImportError:  # pragma: no cover - the extra is a dev dependency
        raise StripeNotConfigured(
            "The stripe package is not installed: pip install 'llm-budgets[stripe]'."
        ) from None
    base = conf.STRIPE_API_BASE
    return stripe.StripeClient(
        key,
        base_addresses={"api": base, "files": base, "connect": base, "meter_events": base},
        max_network_retries=0,
        http_client=stripe.new_default_http_client(timeout=TIMEOUT_SECONDS),
    )
