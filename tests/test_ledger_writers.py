"""Every writer, named (issue #37, item 3): each module in docs/architecture.md's "Writes"
column is called inside a host's ``atomic()`` block that then rolls back. A money movement
survives it (it committed on the ledger's own connection); configuration and the jobs' own rows
do not (they join the caller's transaction). A writer added to the table without a case here
fails ``test_every_writer_has_a_case``.

On SQLite, and where ``LEDGER_DATABASE = "default"``, the ledger joins the caller's transaction,
so there every write rolls back (the documented risk, check W051)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.db.ledger import ledger_joins_caller
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import (
    AlertDelivery,
    AlertEndpoint,
    AlertEvent,
    ApiKey,
    BillingLine,
    Budget,
    BudgetRaise,
    Counter,
    CreditLot,
    DailyUsage,
    EndUser,
    IdempotencyRecord,
    JobRun,
    KillSwitch,
    Membership,
    ModelAlias,
    Plan,
    Price,
    Refusal,
    Reservation,
    Run,
    StripeCustomerLink,
    Tenant,
    ThresholdCrossing,
    TopUp,
    UsageRecord,
)
from tests.api import BASE, client_for, new_key, reserve_body
from tests.factories import price_fake, reserve_30, seed

pytestmark = pytest.mark.django_db(transaction=True)

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
LEDGER, CALLER = "ledger", "caller"


class HostRolledBack(Exception):
    pass


@dataclass(frozen=True)
class Case:
    """``side``: where the module's writes commit; ``setup`` (committed), then ``write`` inside
    the host's block; ``rows`` counts what the write adds."""

    side: str
    write: Callable[[], object]
    rows: Callable[[], int]
    setup: Callable[[], object] = lambda: None


_API_KEY: list[str] = []


def _api_reserve_with_key() -> None:
    """A reserve over REST with an idempotency key (the API's own row: its record)."""
    response = client_for(_API_KEY[-1]).post(
        f"{BASE}reservations",
        reserve_body(end_user="u1"),
        format="json",
        HTTP_IDEMPOTENCY_KEY="writers-1",
    )
    assert response.status_code == 201, response.content


def _tenant_with_spend() -> None:
    seed(limit="100")
    reserve_30(end_user="u1").commit(input_tokens=0, output_tokens=1000)


def _today() -> date:
    return timezone.now().date()


def _acme() -> Tenant:
    return Tenant.objects.get(external_id="acme")


def _budget() -> Budget:
    return Budget.objects.get(tenant__external_id="acme", end_user__isnull=True)


def _refused() -> None:
    try:
        reserve_30(max_output_tokens=100_000)
    except BudgetExceeded:
        return
    raise AssertionError("the call was admitted")


def _hot_setup() -> None:
    seed(limit="100")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="month", hot=True, stripes=2)


def _prepaid_setup() -> None:
    from llm_budgets.billing.credits import balance_open, recharge_set
    from llm_budgets.billing.topups import credit_grant

    seed(limit="1000000")
    balance_open(tenant="acme", actor="t")
    credit_grant(tenant="acme", amount="100", actor="t", reason="start")
    recharge_set(tenant="acme", below="80", amount="50", actor="t")


def _grant() -> None:
    from llm_budgets.billing.topups import credit_grant

    credit_grant(tenant="acme", amount="5", actor="t", reason="goodwill")


def _prepaid_only() -> None:
    from llm_budgets.billing.credits import balance_open

    seed(limit="1000000")
    balance_open(tenant="acme", actor="t")


def _anomaly_setup() -> None:
    seed(limit="100000")
    Plan.objects.create(name="guarded", anomaly_tenant_spend=Decimal(50), anomaly_window_minutes=10)
    budgets.ensure_tenant(tenant="acme", plan="guarded")
    reserve_30(end_user="u-1").commit(input_tokens=0, output_tokens=1000)
    reserve_30(end_user="u-2")  # 60 in the window: past 50


def _endpoint() -> object:
    from llm_budgets.alerts.endpoints import endpoint_create

    return endpoint_create(
        tenant=_acme(),
        kind="webhook",
        target="https://hooks.example.com/x",
        event_types=["budget.exhausted"],
    )


def _emit() -> object:
    """An event through ``alert_emit`` (the test event's body is the simplest valid one)."""
    from llm_budgets.alerts.endpoints import endpoint_test_send

    return endpoint_test_send(AlertEndpoint.objects.get())


def _self_serve_subscribe() -> object:
    from llm_budgets.alerts.self_serve import self_serve_subscribe
    from llm_budgets.control.self_serve import TenantAdmin

    return self_serve_subscribe(
        TenantAdmin(tenant=_acme(), person="ada"),
        kind="webhook",
        target="https://hooks.example.com/y",
        event_types=["budget.exhausted"],
        confirm_site="https://host.example",
    )


def _deliver() -> object:
    from llm_budgets.alerts.delivery import alerts_deliver

    return alerts_deliver()


def _membership() -> object:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    get_user_model().objects.create_user("ada", "ada@example.com")
    return call_command("llm_budgets_membership", "add", "ada", "acme")


CASES: dict[str, Case] = {
    "signals.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.roles", fromlist=["roles_sync"]).roles_sync(),
        lambda: Group.objects.count(),
        setup=lambda: Group.objects.all().delete(),
    ),
    "schedule.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.schedule", fromlist=["x"]).periodic_tasks_install(),
        lambda: __import__(
            "django_celery_beat.models", fromlist=["PeriodicTask"]
        ).PeriodicTask.objects.count(),
    ),
    "pricing/prices.py": Case(
        CALLER,
        lambda: budgets.set_price(
            provider="fake", model="new", input_per_mtok=Decimal(1), output_per_mtok=Decimal(2)
        ),
        lambda: Price.objects.count(),
    ),
    "pricing/model_names.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.pricing.model_names", fromlist=["x"]).model_alias_set(
            pattern="my-model", model="m30", provider="fake"
        ),
        lambda: ModelAlias.objects.count(),
        setup=price_fake,
    ),
    "pricing/sync.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.pricing.sync", fromlist=["x"]).prices_sync(
            provider="openai", model="gpt-4o"
        ),
        lambda: Price.objects.count(),
    ),
    "tenancy/tenants.py": Case(
        CALLER,
        lambda: budgets.ensure_tenant(tenant="newco"),
        lambda: Tenant.objects.count(),
    ),
    "tenancy/runs.py": Case(
        CALLER,
        lambda: budgets.close_run(tenant="acme", run="r1"),
        lambda: Run.objects.filter(closed_at__isnull=False).count(),
        setup=lambda: (seed(), reserve_30(run="r1").release()),
    ),
    "control/limits.py": Case(
        CALLER,
        lambda: budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(5), window="day"),
        lambda: Budget.objects.count(),
        setup=seed,
    ),
    "control/raises.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.control.raises", fromlist=["x"]).budget_raise_grant(
            budget=_budget(),
            amount=Decimal(10),
            until=timezone.now() + timedelta(days=1),
            reason="launch",
        ),
        lambda: BudgetRaise.objects.count(),
        setup=seed,
    ),
    "control/killswitches.py": Case(
        LEDGER,
        lambda: budgets.trip(tenant="acme", reason="abuse", actor="ops"),
        lambda: KillSwitch.objects.count(),
        setup=seed,
    ),
    "alerts/self_serve.py": Case(
        CALLER,
        _self_serve_subscribe,
        lambda: AlertEndpoint.objects.count(),
        setup=lambda: (seed(), Tenant.objects.update(self_serve=True)),
    ),
    "control/refusals.py": Case(LEDGER, _refused, lambda: Refusal.objects.count(), setup=seed),
    "engine/admission.py": Case(
        LEDGER, lambda: reserve_30(), lambda: Reservation.objects.count(), setup=seed
    ),
    "engine/first_sight.py": Case(
        LEDGER,
        lambda: reserve_30(end_user="first", run="first"),
        lambda: EndUser.objects.count() + Run.objects.count(),
        setup=seed,
    ),
    "engine/settlement.py": Case(
        LEDGER,
        lambda: budgets.commit(Reservation.objects.get().pk, input_tokens=0, output_tokens=1000),
        lambda: UsageRecord.objects.count(),
        setup=lambda: (seed(), reserve_30()),
    ),
    "engine/adjustments.py": Case(
        LEDGER,
        lambda: __import__("llm_budgets.engine.adjustments", fromlist=["x"]).usage_void(
            record_id=UsageRecord.objects.get().pk, reason="refund"
        ),
        lambda: UsageRecord.objects.count(),
        setup=_tenant_with_spend,
    ),
    "engine/stripes.py": Case(
        LEDGER,
        lambda: reserve_30(),
        lambda: Counter.objects.exclude(stripe=None).count(),
        setup=_hot_setup,
    ),
    "billing/balances.py": Case(
        LEDGER,
        lambda: reserve_30().commit(input_tokens=0, output_tokens=1000),  # 30: below 80
        lambda: TopUp.objects.count(),
        setup=_prepaid_setup,
    ),
    "billing/outbox.py": Case(
        LEDGER,
        lambda: reserve_30().commit(input_tokens=0, output_tokens=1000),
        lambda: BillingLine.objects.count(),
        setup=lambda: (seed(), budgets.link_stripe_customer(tenant="acme", customer_id="cus_w")),
    ),
    "jobs/thresholds.py": Case(
        LEDGER,
        lambda: __import__("llm_budgets.jobs.thresholds", fromlist=["x"]).thresholds_scan(),
        lambda: ThresholdCrossing.objects.count(),
        setup=lambda: (seed(limit="50"), reserve_30().commit(input_tokens=0, output_tokens=1000)),
    ),
    "jobs/rollups.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.jobs.rollups", fromlist=["x"]).daily_usage_rebuild(
            since=_today() - timedelta(days=1), until=_today() + timedelta(days=1)
        ),
        lambda: DailyUsage.objects.count(),
        setup=_tenant_with_spend,
    ),
    "jobs/retention.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.jobs.retention", fromlist=["x"]).refusals_purge(
            now=timezone.now() + timedelta(days=3650)
        ),
        lambda: -Refusal.objects.count(),  # a purge removes rows
        setup=lambda: (seed(), _refused()),
    ),
    "jobs/anomalies.py": Case(
        LEDGER,
        lambda: __import__("llm_budgets.jobs.anomalies", fromlist=["x"]).anomalies_detect(),
        lambda: KillSwitch.objects.count(),
        setup=_anomaly_setup,
    ),
    "jobs/records.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.jobs.records", fromlist=["x"]).job_finished(
            "llm_budgets.sweep"
        ),
        lambda: JobRun.objects.count(),
    ),
    "alerts/emit.py": Case(
        CALLER,
        _emit,
        lambda: AlertEvent.objects.count(),
        setup=lambda: (seed(), _endpoint()),
    ),
    "alerts/endpoints.py": Case(
        CALLER, _endpoint, lambda: AlertEndpoint.objects.count(), setup=seed
    ),
    "alerts/delivery.py": Case(
        CALLER,
        _deliver,
        lambda: AlertDelivery.objects.exclude(attempts=0).count(),
        setup=lambda: (seed(), _endpoint(), _emit()),
    ),
    "billing/": Case(
        LEDGER,
        _grant,
        lambda: CreditLot.objects.count(),
        setup=_prepaid_only,
    ),
    "control/api_keys.py": Case(
        CALLER,
        lambda: __import__("llm_budgets.control.api_keys", fromlist=["x"]).api_key_create(
            tenant="acme", name="k"
        ),
        lambda: ApiKey.objects.count(),
        setup=seed,
    ),
    "api/": Case(
        CALLER,
        lambda: _api_reserve_with_key(),
        lambda: IdempotencyRecord.objects.count(),
        setup=lambda: (seed(), _API_KEY.append(new_key("acme"))),
    ),
    "admin/": Case(
        CALLER,
        lambda: Plan.objects.create(name="Pro"),
        lambda: Plan.objects.count(),
    ),
    "management/": Case(
        CALLER,
        _membership,
        lambda: Membership.objects.count(),
        setup=seed,
    ),
}
# Writers documented on the same row as another module (which writes nothing).
SAME_ROW = {"roles.py": "signals.py", "routers.py": "schedule.py"}
# Links to Stripe are configuration: they join the caller's transaction (billing/links.py).
LINK = Case(
    CALLER,
    lambda: budgets.link_stripe_customer(tenant="acme", customer_id="cus_l"),
    lambda: StripeCustomerLink.objects.count(),
    setup=seed,
)


def writers() -> list[str]:
    """The first module named on each row of the table whose "Writes" cell is not "—"."""
    table = DOC.read_text().split("<!-- modules")[1].split("<!-- /modules")[0]
    found = []
    for line in table.splitlines():
        cells = line.split("|")
        if not line.startswith("| `") or cells[3].strip().startswith("—"):
            continue
        found.append(re.findall(r"`([^`]+)`", cells[1])[0])
    return found


def test_every_writer_has_a_case() -> None:
    missing = [name for name in writers() if name not in CASES]
    assert missing == [], f"add a case to tests/test_ledger_writers.py for {missing}"
    assert set(CASES) == set(writers())


@pytest.mark.parametrize("name", sorted([*CASES, "billing/links.py"]))
def test_a_writer_in_a_host_block_that_rolls_back(name: str) -> None:
    if name == "schedule.py" and sys.version_info >= (3, 12):
        # As the host matrix says (EXCLUDED["celery_beat"]): not installed there.
        pytest.skip("django-celery-beat is not installed on Python >= 3.12 (it caps Django < 6.1)")
    case = LINK if name == "billing/links.py" else CASES[name]
    case.setup()
    before = case.rows()
    try:
        with transaction.atomic():
            case.write()
            assert case.rows() != before, f"{name}'s case wrote nothing"
            raise HostRolledBack
    except HostRolledBack:
        pass
    side = CALLER if ledger_joins_caller() else case.side
    after = case.rows()
    if side == LEDGER:
        assert after != before, f"{name}: a money movement was rolled back with the host"
    else:
        assert after == before, f"{name}: configuration survived the host's rollback"
