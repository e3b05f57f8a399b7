"""Property-based test (issue item H): random sequences of reserve / commit / release / sweep /
clock moves / run closes, over two tenants and their end users under global, tenant and
end-user budgets, and (issue #16) t1's each-run budget and a tag budget, for calls naming a run,
a tag, both or neither. Issue 22: staff corrections interleave with them (spend resets of an end
user, a run and a tag budget; voids; temporary raises; limit changes), and commits report usage
beyond their hold too (refused, the hold left as it was). Issue 38: bursts of tiny holds (one
input token, one output token) reserved until refused or done, each committed at the input
tolerance (all the plausibility rule admits), and commits of any hold at the tolerance: a commit
within the rule never costs more than its hold, and with expired holds charged (the default) no
counter ever passes its limit, overage or not: a limit holds in total.

After every step the ledger conserves (each counter's spent is the sum of its ledger lines and
its reserved the sum of its live holds), no counter is past its limit by more than the overage
recorded on its lines, and every reservation is in the state a simple model predicts. The clock
is fixed and moved by the test (services take ``now=``), across day and month boundaries.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest
from django.db import transaction
from django.test import override_settings
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from llm_budgets import budgets
from llm_budgets.control.raises import budget_raise_grant
from llm_budgets.engine.adjustments import (
    budget_spend_reset,
    end_user_spend_reset,
    run_spend_reset,
    usage_void,
)
from llm_budgets.engine.admission import reservation_create
from llm_budgets.engine.applicable import scopes_for_read
from llm_budgets.engine.settlement import (
    CommitResult,
    reservation_commit,
    reservation_release,
    reservations_sweep,
)
from llm_budgets.exceptions import (
    BudgetExceeded,
    IdempotencyKeyReused,
    ReservationStateError,
    RunClosed,
    UsageExceedsHold,
)
from llm_budgets.jobs.reconcile import allowances_excess, counters_drift
from llm_budgets.models import (
    Budget,
    Counter,
    EndUser,
    Reservation,
    ReservationState,
    Scope,
    Tenant,
    UsageKind,
    UsageRecord,
)
from llm_budgets.reads.statuses import budget_statuses
from llm_budgets.tenancy.runs import run_close
from llm_budgets.usage import input_allowed
from tests.concurrency import overspent_counters

pytestmark = pytest.mark.django_db

PROVIDER, MODEL = "fake", "prop"
INPUT_PER_MTOK, OUTPUT_PER_MTOK = Decimal("2.5"), Decimal("10000")  # output: 0.01 a token
# An hour before midnight in Amsterdam (t1's day and billing month, day 31 clamped to
# February's last) and three before the UTC month ends (the global cap, t2's month).
START = datetime(2026, 1, 31, 21, 0, tzinfo=UTC)
# Who calls, and how many budgets apply to them: a hold is on all of these or on none.
CALLERS: dict[tuple[str, str | None], int] = {
    ("t1", "u1"): 3,  # global month, t1 day, t1 "*" day
    ("t1", "u2"): 3,
    ("t1", "vip"): 4,  # ... and vip's own month
    ("t1", None): 2,  # global month, t1 day
    ("t2", "u1"): 2,  # global month, t2 month (t2 has no end-user budgets)
    ("t2", None): 2,
}
# What a call names beyond its tenant and end user: a run, the project tag, both or neither. t1
# has an each-run lifetime budget and a budget for project=alpha; t2 has neither.
SCOPES: list[tuple[str | None, str | None]] = [
    (None, None),
    (None, None),
    ("r1", None),
    ("r2", "alpha"),
    (None, "alpha"),
    (None, "beta"),
]
CLOCK_STEPS = [
    timedelta(minutes=1),
    timedelta(minutes=45),
    timedelta(hours=2),
    timedelta(hours=23),
    timedelta(days=1),
    timedelta(days=9),
    timedelta(days=31),
]
HELD, COMMITTED = ReservationState.HELD, ReservationState.COMMITTED
RELEASED, EXPIRED = ReservationState.RELEASED, ReservationState.EXPIRED


def _cost(input_tokens: int, output_tokens: int) -> Decimal:
    # Exact at the stored precision for these prices: no rounding to model.
    return (input_tokens * INPUT_PER_MTOK + output_tokens * OUTPUT_PER_MTOK) / 1_000_000


def _worst_case(input_tokens: int, max_output_tokens: int) -> Decimal:
    """A request's worst case as the model sees it: the held input and the input tolerance a
    commit may report beyond it (issue 38), and the output ceiling."""
    return _cost(input_allowed(input_tokens), max_output_tokens)


def _counters() -> list[tuple[int, Decimal, Decimal]]:
    return list(Counter.objects.order_by("pk").values_list("pk", "spent", "reserved"))


class LedgerMachine(RuleBasedStateMachine):
    holds = Bundle("holds")
    stripes: int | None = None  # hot budgets, split into this many stripes (issue #15)

    def __init__(self) -> None:
        super().__init__()
        # Each example runs in a savepoint of the test's transaction, rolled back in teardown.
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self._settings: override_settings | None = None
        self.now = START
        self.states: dict[UUID, str] = {}
        self.expires: dict[UUID, datetime] = {}
        self.results: dict[UUID, CommitResult] = {}
        self.held: dict[UUID, tuple[int, int]] = {}  # input tokens, output ceiling
        # Per budget, the most it could ever admit: its highest limit plus every raise granted.
        self.ceilings: dict[int, Decimal] = {}
        self.raised: dict[int, Decimal] = {}
        self.keys: dict[tuple[str, str], UUID] = {}
        # What the first call with each key asked for: another request with it is refused.
        self.asked: dict[tuple[str, str], tuple[object, ...]] = {}
        self.changed = True
        budgets.set_price(
            provider=PROVIDER,
            model=MODEL,
            input_per_mtok=INPUT_PER_MTOK,
            output_per_mtok=OUTPUT_PER_MTOK,
            effective_from=START - timedelta(days=365),
        )
        budgets.set_limit(amount=Decimal(120), window="month")
        budgets.ensure_tenant(tenant="t1", timezone="Europe/Amsterdam", billing_day=31)
        budgets.set_limit(tenant="t1", amount=Decimal(60), window="day")
        budgets.set_limit(tenant="t1", end_user="*", amount=Decimal(35), window="day")
        budgets.set_limit(tenant="t1", end_user="vip", amount=Decimal(50), window="month")
        budgets.set_limit(tenant="t1", run="*", amount=Decimal(40), window="lifetime")
        budgets.set_limit(tenant="t1", tag=("project", "alpha"), amount=Decimal(45), window="month")
        self.closed: set[tuple[str, str]] = set()
        budgets.ensure_tenant(tenant="t2")
        budgets.set_limit(tenant="t2", amount=Decimal(70), window="month")
        if self.stripes is not None:
            # Issue #15: every budget hot, its counter split into this many stripes.
            Budget.objects.update(hot=True, stripes=self.stripes)

    def teardown(self) -> None:
        if self._settings is not None:
            self._settings.disable()
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    @initialize(policy=st.sampled_from(["charge", "charge", "release"]))
    def expired_hold_policy(self, policy: str) -> None:
        self.policy = policy
        self._settings = override_settings(LLM_BUDGETS={"EXPIRED_HOLD_POLICY": policy})
        self._settings.enable()

    @rule(
        target=holds,
        caller=st.sampled_from(list(CALLERS)),
        input_tokens=st.integers(0, 5000),
        max_output_tokens=st.sampled_from([100, 1500, 3000]),
        ttl=st.sampled_from([60, 3600, 86400]),
        key=st.sampled_from([None, None, None, None, None, None, "k1", "k2"]),
        scopes=st.sampled_from(SCOPES),
    )
    def reserve(
        self,
        caller: tuple[str, str | None],
        input_tokens: int,
        max_output_tokens: int,
        ttl: int,
        key: str | None,
        scopes: tuple[str | None, str | None],
    ) -> object:
        tenant, end_user = caller
        run, project = scopes
        tags = {"project": project} if project else None
        self.changed = True
        before = _counters()
        if run is not None and (tenant, run) in self.closed:
            with pytest.raises(RunClosed):
                reservation_create(
                    tenant=tenant,
                    end_user=end_user,
                    provider=PROVIDER,
                    model=MODEL,
                    input_tokens=input_tokens,
                    max_output_tokens=max_output_tokens,
                    ttl=ttl,
                    run=run,
                    tags=tags,
                    now=self.now,
                )
            event("reserve refused: its run was closed")
            assert _counters() == before
            return multiple()
        call = {
            "tenant": tenant,
            "end_user": end_user,
            "provider": PROVIDER,
            "model": MODEL,
            "input_tokens": input_tokens,
            "max_output_tokens": max_output_tokens,
            "idempotency_key": key,
            "ttl": ttl,
            "run": run,
            "tags": tags,
            "now": self.now,
        }
        asked = (end_user, input_tokens, max_output_tokens, run, tags or {})
        if key is not None and self.asked.get((tenant, key), asked) != asked:
            # The key belongs to another request: refused, nothing held.
            with pytest.raises(IdempotencyKeyReused):
                reservation_create(**call)  # type: ignore[arg-type]
            event("reserve refused: its idempotency key was used for another request")
            assert _counters() == before
            return multiple()
        try:
            reservation = reservation_create(**call)  # type: ignore[arg-type]
        except BudgetExceeded as exc:
            event(f"reserve refused by a {exc.scope.split()[0]} budget")
            worst_case = _worst_case(input_tokens, max_output_tokens)
            self._assert_justified(exc, before, caller, key, run, tags, worst_case)
            return multiple()
        if key is not None and (tenant, key) in self.keys:
            # Same key, same tenant: the same reservation, and nothing more is reserved.
            event("reserve replayed an idempotency key")
            assert reservation.pk == self.keys[(tenant, key)]
            assert _counters() == before
            return multiple()
        if key is not None:
            self.keys[(tenant, key)] = reservation.pk
            self.asked[(tenant, key)] = asked
        extra = (run is not None) + (project == "alpha") if tenant == "t1" else 0
        assert reservation.holds.count() == CALLERS[caller] + extra
        self.states[reservation.pk] = HELD
        self.expires[reservation.pk] = reservation.expires_at
        self.held[reservation.pk] = (reservation.input_tokens, reservation.max_output_tokens)
        return reservation.pk

    def _assert_justified(
        self,
        exc: BudgetExceeded,
        before: list[tuple[int, Decimal, Decimal]],
        caller: tuple[str, str | None],
        key: str | None,
        run: str | None,
        tags: dict[str, str] | None,
        worst_case: Decimal,
    ) -> None:
        """A refusal names a budget that has no room for the request, and holds nothing."""
        tenant, end_user = caller
        assert key is None or (tenant, key) not in self.keys
        tenant_obj = Tenant.objects.get(external_id=tenant)
        # A refused first call creates no end user (issue #22.9): read it unsaved then.
        user_obj = (
            tenant_obj.end_users.filter(external_id=end_user).first()
            or EndUser(tenant=tenant_obj, external_id=end_user)
            if end_user
            else None
        )
        scopes = scopes_for_read(tenant_obj, run=run, tags=tags)
        (status,) = [
            s
            for s in budget_statuses(tenant_obj, user_obj, self.now, scopes)
            if s.budget_id == exc.budget_id
        ]
        # Refused only when its worst case, the input tolerance included, has no room.
        assert exc.requested == worst_case
        assert status.spent + status.reserved + exc.requested > status.limit
        # A refusal adds no row (issue #22.9) and changes none.
        assert _counters() == before

    @rule(rid=holds, input_tokens=st.integers(0, 6000), output_tokens=st.integers(0, 4000))
    def commit(self, rid: UUID, input_tokens: int, output_tokens: int) -> None:
        self.changed = True
        state = self.states[rid]
        if state == RELEASED:
            before = _counters()
            with pytest.raises(ReservationStateError):
                reservation_commit(
                    rid, input_tokens=input_tokens, output_tokens=output_tokens, now=self.now
                )
            assert _counters() == before
            return
        held_input, ceiling = self.held[rid]
        if state != COMMITTED and (
            output_tokens > ceiling or input_tokens > input_allowed(held_input)
        ):
            # Usage the hold could not have produced: refused, nothing written, still open.
            before = _counters()
            with pytest.raises(UsageExceedsHold):
                reservation_commit(
                    rid, input_tokens=input_tokens, output_tokens=output_tokens, now=self.now
                )
            event(f"commit of a {state} hold refused: usage beyond it")
            assert _counters() == before
            return
        result = reservation_commit(
            rid, input_tokens=input_tokens, output_tokens=output_tokens, now=self.now
        )
        if state == COMMITTED:
            assert result == self.results[rid]  # settling twice returns the first result
            return
        cost = _cost(input_tokens, output_tokens)
        event(f"commit of a {state} hold ({self.policy})")
        assert (result.state, result.cost) == (COMMITTED, cost)
        if state == EXPIRED and self.policy == "release":
            # Its hold was dropped at expiry: the whole cost lands without one, as overage.
            assert result.overage == cost
        else:
            # Issue 38: usage within the rule never costs more than the hold (which prices the
            # input tolerance): no overage, whatever the caller reports.
            assert cost <= result.reserved == _worst_case(held_input, ceiling)
            assert result.overage == 0
        self.states[rid] = COMMITTED
        self.results[rid] = result

    @rule(rid=holds)
    def commit_at_the_tolerance(self, rid: UUID) -> None:
        """All the rule admits: the held input plus the tolerance, and the output ceiling."""
        held_input, ceiling = self.held[rid]
        self.commit(rid, input_allowed(held_input), ceiling)

    @rule(
        caller=st.sampled_from(list(CALLERS)),
        count=st.integers(1, 12),
        scopes=st.sampled_from(SCOPES),
        input_tokens=st.integers(0, 2),
    )
    def tiny_calls_at_the_tolerance(
        self,
        caller: tuple[str, str | None],
        count: int,
        scopes: tuple[str | None, str | None],
        input_tokens: int,
    ) -> None:
        """Issue 38's probe: tiny holds reserved until one is refused (or ``count``), then each
        committed at the tolerance. Priced outside the hold, each such commit added the
        tolerance's cost past the limit; now the limit holds in total."""
        admitted = []
        for _ in range(count):
            rid = self.reserve(caller, input_tokens, 1, 3600, None, scopes)
            if not isinstance(rid, UUID):
                break  # refused
            admitted.append(rid)
        event(f"tiny calls: {'all admitted' if len(admitted) == count else 'until refused'}")
        for rid in admitted:
            self.commit_at_the_tolerance(rid)

    @rule(rid=holds)
    def release(self, rid: UUID) -> None:
        self.changed = True
        state = self.states[rid]
        expected = state if state in (COMMITTED, RELEASED) else RELEASED
        event(f"release of a {state} hold ({self.policy})")
        assert reservation_release(rid, now=self.now) == expected
        self.states[rid] = expected

    @rule()
    def sweep(self) -> None:
        due = [r for r, s in self.states.items() if s == HELD and self.expires[r] <= self.now]
        assert reservations_sweep(now=self.now) == len(due)
        self.changed = self.changed or bool(due)
        for rid in due:
            self.states[rid] = EXPIRED

    @rule(rid=holds)
    def let_hold_expire(self, rid: UUID) -> None:
        """Move the clock to a hold's expiry and sweep: makes late commits and releases common."""
        self.now = max(self.now, self.expires[rid])
        self.sweep()

    @rule(run=st.sampled_from(["r1", "r2"]))
    def close_run(self, run: str) -> None:
        """Close a run of t1: later calls naming it are refused; its holds settle as usual."""
        run_close(tenant="t1", run=run, now=self.now)
        self.closed.add(("t1", run))

    @rule(step=st.sampled_from(CLOCK_STEPS))
    def advance_clock(self, step: timedelta) -> None:
        self.now += step

    # Staff corrections (issue 22 item 1): each may come between a hold's expiry and its late
    # commit or release, which must still settle (the floor rule: no counter below zero).

    @rule(who=st.sampled_from(["u1", "u2", "vip"]))
    def reset_end_user(self, who: str) -> None:
        user = EndUser.objects.filter(tenant__external_id="t1", external_id=who).first()
        if user is not None:
            self.changed = True
            event("end user spend reset")
            end_user_spend_reset(end_user=user, reason="support", now=self.now)

    @rule(run=st.sampled_from(["r1", "r2"]))
    def reset_run(self, run: str) -> None:
        self.changed = True
        event("run spend reset")
        run_spend_reset(tenant="t1", run=run, reason="support", now=self.now)

    @rule()
    def reset_tag_budget(self) -> None:
        self.changed = True
        event("tag budget spend reset")
        budget_spend_reset(budget=Budget.objects.get(scope=Scope.TAG), reason="x", now=self.now)

    @rule(pick=st.integers(0, 1000))
    def void_a_line(self, pick: int) -> None:
        voidable = list(
            UsageRecord.objects.filter(
                reservation__state=COMMITTED,
                kind__in=[UsageKind.CHARGE, UsageKind.TRUE_UP],
                voided_by__isnull=True,
                cost__gt=0,  # a refund (a true-up down) is not voided
            ).order_by("pk")
        )
        if voidable:
            self.changed = True
            event("a line voided")
            usage_void(record_id=voidable[pick % len(voidable)].pk, reason="x", now=self.now)

    @rule(
        pick=st.integers(0, 1000), amount=st.sampled_from([5, 25]), hours=st.sampled_from([1, 30])
    )
    def grant_raise(self, pick: int, amount: int, hours: int) -> None:
        every = list(Budget.objects.order_by("pk"))
        budget = every[pick % len(every)]
        self.changed = True
        self.raised[budget.pk] = self.raised.get(budget.pk, Decimal(0)) + amount
        budget_raise_grant(
            budget=budget,
            amount=Decimal(amount),
            until=self.now + timedelta(hours=hours),
            reason="launch",
            now=self.now,
        )

    @rule(amount=st.sampled_from([10, 30, 60, 90]))
    def change_t1_day_limit(self, amount: int) -> None:
        budget = Budget.objects.get(scope=Scope.TENANT, tenant__external_id="t1")
        self.ceilings[budget.pk] = max(self.ceilings.get(budget.pk, budget.limit), Decimal(amount))
        self.changed = True
        event("tenant limit changed")
        budgets.set_limit(tenant="t1", amount=Decimal(amount), window="day", reason="x")

    # Checked after every step that wrote to the ledger (clock moves write nothing).
    @precondition(lambda self: self.changed)
    @invariant()
    def ledger_consistent(self) -> None:
        self.changed = False
        assert counters_drift() == []
        limits = {
            b.pk: max(self.ceilings.get(b.pk, b.limit), b.limit) + self.raised.get(b.pk, 0)
            for b in Budget.objects.all()
        }
        assert overspent_counters(limits) == []
        if self.policy == "charge":
            # A limit holds in total (issue 38): with no hold dropped at expiry (the host's
            # "release" opt-in) and no usage beyond a hold recorded, no line carries overage, so
            # no counter is past its limit at all.
            assert not UsageRecord.objects.filter(overage__gt=0).exists()
        assert allowances_excess() == []
        assert dict(Reservation.objects.values_list("pk", "state")) == self.states


def test_random_ledger_histories_keep_the_invariants() -> None:
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(max_examples=25, stateful_step_count=40, deadline=None, database=None),
    )


@pytest.mark.parametrize("stripes", [1, 2, 8])
def test_random_ledger_histories_keep_the_invariants_on_hot_caps(stripes: int) -> None:
    """Issue #15: the same histories with every budget hot (the rolling ones aside, none here):
    refusals are still justified by the whole cap's numbers (``_assert_justified`` reads the
    summed status), the stripes of each cap never pass its limit together, and their
    allowances never promise more than the cap has left."""

    class HotLedgerMachine(LedgerMachine):
        pass

    HotLedgerMachine.stripes = stripes
    run_state_machine_as_test(
        HotLedgerMachine,
        settings=settings(max_examples=20, stateful_step_count=40, deadline=None, database=None),
    )
