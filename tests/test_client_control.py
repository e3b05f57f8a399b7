"""The Python client against a live server for [control]: trip, clear and list kill switches,
KillSwitchActive rebuilt with its attributes, and allow_degrade on the hold."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from llm_budgets.client import ApiError, BudgetsClient, RemoteHold
from llm_budgets.exceptions import BudgetExceeded, InvalidUsage, KillSwitchActive
from tests.api import BASE, new_key
from tests.factories import FAKE_MODEL, FAKE_PROVIDER, reserve_30, seed
from tests.test_degradation import CHEAP, _setup

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def clients(live_server: Any) -> dict[str, BudgetsClient]:
    seed(limit="100")
    url = f"{live_server.url}{BASE}"
    return {
        "operator": BudgetsClient(url, new_key(None, name="ops")),
        "acme": BudgetsClient(url, new_key("acme", name="acme-app")),
    }


def reserve(client: BudgetsClient, **kwargs: Any) -> RemoteHold:
    return client.reserve(
        provider=FAKE_PROVIDER, model=FAKE_MODEL, input_tokens=0, max_output_tokens=1000, **kwargs
    )


def test_trip_refuses_with_kill_switch_active_and_clear_reopens(
    clients: dict[str, BudgetsClient],
) -> None:
    operator, acme = clients["operator"], clients["acme"]
    switch = operator.trip(tenant="acme", model=FAKE_MODEL, reason="bad deploy")
    assert switch.active
    assert switch.scope == f"tenant acme, model {FAKE_MODEL}"
    assert switch.tripped_by.startswith("api-key:")
    assert switch.tripped_by.endswith("(ops)")
    assert isinstance(switch.tripped_at, datetime)

    with pytest.raises(KillSwitchActive) as caught:
        reserve(acme)
    refusal = caught.value
    assert refusal.reason == "bad deploy"
    assert refusal.tripped_by == switch.tripped_by
    assert refusal.tripped_at == switch.tripped_at
    assert refusal.switch_id == switch.id
    assert refusal.scope == switch.scope
    assert refusal.automatic is False
    # The request's own fields, as the in-process exception has them (issue #10, item 2).
    assert (refusal.tenant, refusal.end_user, refusal.model) == ("acme", None, FAKE_MODEL)
    assert "bad deploy" in str(refusal)

    assert [s.id for s in operator.kill_switches(state="open")] == [switch.id]
    cleared = operator.clear(tenant="acme", model=FAKE_MODEL, reason="rolled back")
    assert (cleared.active, cleared.clear_reason) == (False, "rolled back")
    assert cleared.cleared_by == switch.tripped_by
    assert operator.kill_switches(state="open") == []
    assert [s.id for s in operator.kill_switches(state="cleared", tenant="acme")] == [switch.id]
    reserve(acme).release()


def test_kill_switches_follows_pages(clients: dict[str, BudgetsClient]) -> None:
    for n in range(3):
        clients["operator"].trip(model=f"m-{n}", reason="r")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("llm_budgets.api.views.Pagination.default_limit", 2)
        assert len(clients["operator"].kill_switches()) == 3


def test_a_switch_on_one_key(clients: dict[str, BudgetsClient], live_server: Any) -> None:
    key = new_key("acme", name="leaky")
    leaky = BudgetsClient(f"{live_server.url}{BASE}", key)
    switch = clients["operator"].trip(api_key=key.partition(".")[0], reason="leaked key")
    assert switch.api_key == key.partition(".")[0]
    with pytest.raises(KillSwitchActive) as caught:
        reserve(leaky)
    assert caught.value.scope == f"API key {switch.api_key}"
    reserve(clients["acme"]).release()  # the tenant's other key still works


def test_errors_are_the_same_exceptions(clients: dict[str, BudgetsClient]) -> None:
    with pytest.raises(ApiError) as forbidden:
        clients["acme"].trip(reason="mine")
    assert (forbidden.value.status_code, forbidden.value.code) == (403, "operator_key_required")
    with pytest.raises(InvalidUsage) as nothing:
        clients["operator"].clear(tenant="acme", reason="r")
    assert nothing.value.context["field"] == "scope"
    with pytest.raises(InvalidUsage):
        clients["operator"].trip(reason="r", auto_clear_at=timezone.now() - timedelta(1))


def test_allow_degrade_and_the_granted_fields(live_server: Any) -> None:
    _setup()
    acme = BudgetsClient(f"{live_server.url}{BASE}", new_key("acme"))
    reserve_30(max_output_tokens=2667)  # 80.01 %: the model rung applies
    hold = reserve(acme, allow_degrade=True)
    assert (hold.model, hold.requested_model, hold.degraded) == (CHEAP, FAKE_MODEL, True)
    assert (hold.max_output_tokens, hold.amount) == (1000, Decimal(10))
    hold.release()
    with pytest.raises(BudgetExceeded):
        reserve(acme)  # the same call without allow_degrade: 30 does not fit in 19.99
