"""Host transactions around every ledger operation (issue #37, item 2): a hypothesis state
machine runs reserves, commits, releases and limit changes each either outside any transaction
or inside a host's ``atomic()`` block that commits or rolls back, and a limit change followed by
a call inside one block.

Where the ledger has its own connection (PostgreSQL), a money movement stands whatever the host
does and a limit change only if the host commits; a call in the block that changed its limit is
refused with ``configuration_uncommitted``. Where the ledger joins the caller (SQLite), the host's
rollback takes everything with it. Either way: conservation holds, no admission passes the
limit in force, and every hold is in the state the model says."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from llm_budgets import budgets
from llm_budgets.db.ledger import ledger_joins_caller
from llm_budgets.exceptions import BudgetExceeded, ConfigurationUncommitted
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import Counter, Reservation, ReservationState
from tests.factories import price_fake, reserve_30

pytestmark = pytest.mark.django_db(transaction=True)

HOSTS = st.sampled_from(["none", "commit", "rollback"])


class HostRolledBack(Exception):
    pass


def in_host(host: str, work: object) -> object:
    """Run ``work()`` as the host would: alone, or in a block that commits or rolls back."""
    if host == "none":
        return work()  # type: ignore[operator]
    result: list[object] = []
    try:
        with transaction.atomic():
            result.append(work())  # type: ignore[operator]
            if host == "rollback":
                raise HostRolledBack
    except HostRolledBack:
        pass
    return result[0]


class HostTransactionMachine(RuleBasedStateMachine):
    holds = Bundle("holds")

    @initialize()
    def tenant(self) -> None:
        self.joined = ledger_joins_caller()
        self.tenant_id = f"t-{uuid.uuid4().hex[:10]}"
        budgets.ensure_tenant(tenant=self.tenant_id)
        self.limit = Decimal(100)
        budgets.set_limit(tenant=self.tenant_id, amount=self.limit, window="month")
        self.expected: dict[object, str] = {}

    def _stands(self, host: str) -> bool:
        """Whether a money movement made under ``host`` survives it."""
        return host != "rollback" or not self.joined

    @rule(target=holds, host=HOSTS, tokens=st.sampled_from([100, 500, 1000]))
    def reserve(self, host: str, tokens: int) -> object:
        def call() -> object:
            try:
                hold = reserve_30(tenant=self.tenant_id, max_output_tokens=tokens)
            except BudgetExceeded:
                return None
            counter = Counter.objects.get(budget__tenant__external_id=self.tenant_id)
            assert counter.spent + counter.reserved <= self.limit  # admitted within the limit
            return hold.id

        rid = in_host(host, call)
        if rid is not None and self._stands(host):
            self.expected[rid] = ReservationState.HELD
        return rid

    @rule(rid=holds, host=HOSTS, share=st.sampled_from([0, 1, 2]))
    def commit(self, rid: object, host: str, share: int) -> None:
        if self.expected.get(rid) != ReservationState.HELD:
            return
        in_host(host, lambda: budgets.commit(rid, input_tokens=0, output_tokens=50 * share))
        if self._stands(host):
            self.expected[rid] = ReservationState.COMMITTED

    @rule(rid=holds, host=HOSTS)
    def release(self, rid: object, host: str) -> None:
        if self.expected.get(rid) != ReservationState.HELD:
            return
        in_host(host, lambda: budgets.release(rid))
        if self._stands(host):
            self.expected[rid] = ReservationState.RELEASED

    @rule(host=HOSTS, amount=st.sampled_from([40, 100, 160]))
    def change_limit(self, host: str, amount: int) -> None:
        in_host(
            host,
            lambda: budgets.set_limit(
                tenant=self.tenant_id, amount=Decimal(amount), window="month"
            ),
        )
        if host != "rollback":
            self.limit = Decimal(amount)

    @rule(amount=st.sampled_from([40, 160]))
    def change_limit_then_call_in_one_block(self, amount: int) -> None:
        """The documented outcome where the ledger has its own connection: refused at once."""
        try:
            with transaction.atomic():
                budgets.set_limit(tenant=self.tenant_id, amount=Decimal(amount), window="month")
                try:
                    reserve_30(tenant=self.tenant_id, max_output_tokens=100).release()
                except ConfigurationUncommitted:
                    assert not self.joined
                except BudgetExceeded:
                    pass
                else:
                    assert self.joined
                raise HostRolledBack
        except HostRolledBack:
            pass

    @invariant()
    def holds_are_where_the_model_says(self) -> None:
        if not hasattr(self, "expected"):
            return
        states = dict(
            Reservation.objects.filter(tenant__external_id=self.tenant_id).values_list(
                "id", "state"
            )
        )
        assert states == self.expected

    @invariant()
    def conservation(self) -> None:
        assert counters_drift() == []


def test_host_transactions_around_every_ledger_operation() -> None:
    price_fake()
    run_state_machine_as_test(
        HostTransactionMachine,
        settings=settings(max_examples=12, stateful_step_count=20, deadline=None, database=None),
    )
