"""The ledger's tables, one module per domain. Only the services write them.

Invariants that a database can hold are constraints: non-negative amounts, one counter per
(budget, period), one tenant per external id, one charge line per reservation, one reservation per
(tenant, idempotency key).
"""

from llm_budgets.models.alerts import (
    AlertDelivery,
    AlertDeliveryState,
    AlertEndpoint,
    AlertEvent,
    EndpointKind,
)
from llm_budgets.models.api import ApiKey, IdempotencyRecord, RateCounter
from llm_budgets.models.audit import AuditEvent
from llm_budgets.models.billing import (
    BillingLine,
    DeliveryKind,
    InvoiceSettlement,
    MeterDelivery,
    MeterDeliveryState,
    MeterErrorReport,
    ReconciliationDifference,
    ReconciliationRun,
    StripeCustomerBalance,
    StripeCustomerLink,
    StripeInvoice,
    StripeMeter,
    StripePlanMeter,
    StripeWebhookEvent,
    WebhookEventState,
)
from llm_budgets.models.budgets import SHARED_BY, Budget, BudgetUnit, Counter, Run, Scope, Window
from llm_budgets.models.control import BudgetRaise, KillSwitch, Refusal, RefusalKind
from llm_budgets.models.credits import (
    CreditAccount,
    CreditLot,
    DisputeStatus,
    LotKind,
    LotSource,
    TopUp,
    TopUpKind,
    TopUpState,
)
from llm_budgets.models.ledger import (
    LIVE_STATES,
    Reservation,
    ReservationHold,
    ReservationState,
    UsageKind,
    UsageRecord,
)
from llm_budgets.models.memberships import Membership, MembershipRole
from llm_budgets.models.pricing import ModelAlias, Price, PriceSource, PricingBasis
from llm_budgets.models.rollups import DailyUsage, RollupWatermark, TenantDailyUsage
from llm_budgets.models.schedule import JobRun
from llm_budgets.models.tenancy import EndUser, Plan, Tenant, UnknownModelPolicy
from llm_budgets.models.thresholds import CrossingKind, DeliveryState, ThresholdCrossing

__all__ = [
    "LIVE_STATES",
    "SHARED_BY",
    "AlertDelivery",
    "AlertDeliveryState",
    "AlertEndpoint",
    "AlertEvent",
    "ApiKey",
    "AuditEvent",
    "BillingLine",
    "Budget",
    "BudgetRaise",
    "BudgetUnit",
    "Counter",
    "CreditAccount",
    "CreditLot",
    "CrossingKind",
    "DailyUsage",
    "DeliveryKind",
    "DeliveryState",
    "DisputeStatus",
    "EndUser",
    "EndpointKind",
    "IdempotencyRecord",
    "InvoiceSettlement",
    "JobRun",
    "KillSwitch",
    "LotKind",
    "LotSource",
    "Membership",
    "MembershipRole",
    "MeterDelivery",
    "MeterDeliveryState",
    "MeterErrorReport",
    "ModelAlias",
    "Plan",
    "Price",
    "PriceSource",
    "PricingBasis",
    "RateCounter",
    "ReconciliationDifference",
    "ReconciliationRun",
    "Refusal",
    "RefusalKind",
    "Reservation",
    "ReservationHold",
    "ReservationState",
    "RollupWatermark",
    "Run",
    "Scope",
    "StripeCustomerBalance",
    "StripeCustomerLink",
    "StripeInvoice",
    "StripeMeter",
    "StripePlanMeter",
    "StripeWebhookEvent",
    "Tenant",
    "TenantDailyUsage",
    "ThresholdCrossing",
    "TopUp",
    "TopUpKind",
    "TopUpState",
    "UnknownModelPolicy",
    "UsageKind",
    "UsageRecord",
    "WebhookEventState",
    "Window",
]
