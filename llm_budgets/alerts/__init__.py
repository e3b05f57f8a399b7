"""Alerts: signed webhooks, Slack, Teams and email for budget events (docs/alerts.md).

Receivers verify a delivery with :func:`verify`; the services are in ``alerts.emit`` (events and
their outbox rows), ``alerts.endpoints`` (endpoints, secrets) and ``alerts.delivery`` (sending).
"""

from llm_budgets.alerts.signing import SignatureInvalid, sign, verify

__all__ = ["SignatureInvalid", "sign", "verify"]
