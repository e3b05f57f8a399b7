"""Stripe metered billing: a linked tenant's ledger lines reach its Stripe customer's invoice as
meter events, exactly once (docs/billing.md).

- :mod:`~llm_budgets.billing.links`: link and unlink a tenant to a Stripe customer.
- :mod:`~llm_budgets.billing.outbox`: the outbox rows written in the ledger line's transaction.
- :mod:`~llm_budgets.billing.stripe_push`: aggregation per customer, meter and closed hour; sending.
- :mod:`~llm_budgets.billing.reconciliation`: delivered hours against Stripe's summaries.
- :mod:`~llm_budgets.billing.webhooks`: verified, stored, processed-once webhook events.
- :mod:`~llm_budgets.billing.setup`: the meter and the metered price.
- :mod:`~llm_budgets.billing.client`: the configured ``stripe.StripeClient``.
- :mod:`~llm_budgets.billing.totals`: reads for the admin and the tenant pages.
"""
