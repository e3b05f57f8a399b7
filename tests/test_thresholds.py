"""Warning thresholds: detected once per (budget, period, threshold), emailed once, re-armed by a
new period; the claim protects the email against several workers, retries and crashes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.core.management import call_command
from django.test import TestCase, override_settings
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.jobs import thresholds
from llm_budgets.models import Budget, DeliveryState, Plan, Tenant, ThresholdCrossing
from llm_budgets.signals import threshold_crossed
from llm_budgets.tasks import scan_thresholds
from tests.concurrency import run_threads
from tests.factories import billing_contacts, price_fake, reserve_30, reserve_30_at, seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> None:
    seed(limit="100")  # each hold is 30: 1 -> 30 %, 2 -> 60 %, 3 -> 90 %
    billing_contacts("billing@acme.test, cfo@acme.test")


def _scan_job() -> None:
    """The beat job as a worker runs it: outside the test's transaction its on-commit hooks
    (the email tasks) run at once; here they run when the block ends."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        scan_thresholds.delay()


def _crossings() -> list[tuple[int, str]]:
    return list(ThresholdCrossing.objects.order_by("threshold").values_list("threshold", "state"))


@pytest.mark.usefixtures("acme")
def test_crossing_a_threshold_sends_one_email_to_the_billing_contacts() -> None:
    reserve_30()
    _scan_job()
    assert _crossings() == []  # 30 % is below the first threshold (50 %)
    reserve_30()
    _scan_job()
    assert _crossings() == [(50, DeliveryState.SENT)]
    [message] = mail.outbox
    assert message.to == ["billing@acme.test", "cfo@acme.test"]
    assert "50%" in message.subject
    assert "60.00 USD" in message.body  # spent 0 + in flight 60 of 100
    assert message.alternatives[0][1] == "text/html"
    # Scanning again, by any number of workers, sends nothing more.
    _scan_job()
    call_command("llm_budgets_warnings", stdout=_Null())
    assert len(mail.outbox) == 1


@pytest.mark.usefixtures("acme")
def test_thresholds_reached_together_email_only_the_highest() -> None:
    for _ in range(3):
        reserve_30()
    _scan_job()
    assert _crossings() == [(50, DeliveryState.SKIPPED), (80, DeliveryState.SENT)]
    assert len(mail.outbox) == 1
    assert "80%" in mail.outbox[0].subject


@pytest.mark.usefixtures("acme")
def test_a_release_does_not_re_arm_within_the_period() -> None:
    holds = [reserve_30(), reserve_30()]
    _scan_job()
    for hold in holds:
        hold.release()
    reserve_30()
    reserve_30()
    _scan_job()
    assert _crossings() == [(50, DeliveryState.SENT)]
    assert len(mail.outbox) == 1


def test_a_new_period_re_arms_the_thresholds() -> None:
    price_fake(effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    seed(limit="100", window="day")
    billing_contacts("billing@acme.test")
    day1 = datetime(2026, 3, 10, 12, tzinfo=UTC)
    day2 = day1 + timedelta(days=1)
    for at in (day1, day1, day2, day2):
        reserve_30_at(at)
    # Yesterday's counter is not a current period any more: only today's is scanned.
    assert thresholds.thresholds_scan(now=day2 + timedelta(minutes=1))
    for crossing_id in thresholds.thresholds_due():
        thresholds.threshold_warning_send(crossing_id)
    assert list(ThresholdCrossing.objects.values_list("period_start", "threshold")) == [
        (day2.replace(hour=0), 50)
    ]
    assert thresholds.thresholds_scan(now=day2 + timedelta(minutes=2)) == []
    assert len(mail.outbox) == 1


@pytest.mark.usefixtures("acme")
def test_budget_overrides_plan_which_overrides_the_setting() -> None:
    budget = Budget.objects.get()
    assert thresholds.budget_thresholds(budget) == [50, 80, 100]
    plan = Plan.objects.create(name="pro", warning_thresholds=[90, 25])
    Tenant.objects.update(plan=plan)
    budget.refresh_from_db()
    assert thresholds.budget_thresholds(budget) == [25, 90]
    budget.warning_thresholds = []
    assert thresholds.budget_thresholds(budget) == []
    budget.save()
    for _ in range(3):
        reserve_30()
    assert thresholds.thresholds_scan() == []


@override_settings(LLM_BUDGETS={"WARNING_THRESHOLDS": [10]})
@pytest.mark.usefixtures("acme")
def test_the_setting_is_the_default() -> None:
    reserve_30()
    thresholds.thresholds_scan()
    assert _crossings() == [(10, DeliveryState.PENDING)]


@pytest.mark.usefixtures("acme")
def test_no_billing_contacts_skips_the_email_but_still_signals() -> None:
    billing_contacts("")
    seen: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    threshold_crossed.connect(receiver)
    try:
        reserve_30()
        reserve_30()
        _scan_job()
    finally:
        threshold_crossed.disconnect(receiver)
    assert _crossings() == [(50, DeliveryState.SKIPPED)]
    assert mail.outbox == []
    [event] = seen
    assert event["threshold"] == 50
    assert (event["spent"], event["reserved"], event["limit"]) == (0, Decimal(60), Decimal(100))
    assert event["budget"] == Budget.objects.get()


@pytest.mark.usefixtures("acme")
def test_the_signal_waits_for_the_commit(django_capture_on_commit_callbacks: Any) -> None:
    seen: list[int] = []

    def receiver(threshold: int, **kwargs: Any) -> None:
        seen.append(threshold)

    threshold_crossed.connect(receiver)
    try:
        reserve_30()
        reserve_30()
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            thresholds.thresholds_scan()
        assert seen == []  # not committed yet (the test's transaction is still open)
        for callback in callbacks:
            callback()
    finally:
        threshold_crossed.disconnect(receiver)
    assert seen == [50]


def _one_crossing() -> int:
    reserve_30()
    reserve_30()
    [crossing_id] = thresholds.thresholds_scan()
    return crossing_id


@pytest.mark.usefixtures("acme")
def test_a_claimed_warning_is_not_sent_by_another_worker() -> None:
    crossing_id = _one_crossing()
    now = timezone.now()
    ThresholdCrossing.objects.filter(pk=crossing_id).update(
        state=DeliveryState.SENDING, claimed_at=now, claim_token="other-worker"
    )
    assert thresholds.threshold_warning_send(crossing_id, now=now) == DeliveryState.SENDING
    assert thresholds.thresholds_due(now=now) == []
    assert mail.outbox == []


def _crash_after_send(crossing_id: int, monkeypatch: pytest.MonkeyPatch, now: datetime) -> None:
    """The sender dies after the SMTP server accepted the message, before recording it."""

    class Crash(BaseException):
        pass

    real_update = ThresholdCrossing.objects.none().__class__.update

    def update(self: Any, **kwargs: Any) -> int:
        if kwargs.get("state") == DeliveryState.SENT:
            raise Crash
        return real_update(self, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(type(ThresholdCrossing.objects.none()), "update", update)
        with pytest.raises(Crash):
            thresholds.threshold_warning_send(crossing_id, now=now)


@pytest.mark.usefixtures("acme")
def test_at_least_once_a_crash_between_send_and_record_re_sends_after_the_claim_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crossing_id = _one_crossing()
    now = timezone.now()
    _crash_after_send(crossing_id, monkeypatch, now)
    assert len(mail.outbox) == 1
    timeout = timedelta(minutes=10)
    assert thresholds.thresholds_due(now=now + timeout - timedelta(seconds=1)) == []
    later = now + timeout + timedelta(seconds=1)
    assert thresholds.thresholds_due(now=later) == [crossing_id]
    assert thresholds.threshold_warning_send(crossing_id, now=later) == DeliveryState.SENT
    first, second = mail.outbox
    # The duplicate carries the same Message-ID, so mail clients can fold it.
    assert first.extra_headers["Message-ID"] == second.extra_headers["Message-ID"]
    assert ThresholdCrossing.objects.get().attempts == 2


@override_settings(LLM_BUDGETS={"WARNING_DELIVERY": "at_most_once"})
@pytest.mark.usefixtures("acme")
def test_at_most_once_a_crash_between_send_and_record_abandons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crossing_id = _one_crossing()
    now = timezone.now()
    _crash_after_send(crossing_id, monkeypatch, now)
    later = now + timedelta(hours=1)
    assert thresholds.threshold_warning_send(crossing_id, now=later) == DeliveryState.ABANDONED
    assert len(mail.outbox) == 1


@pytest.mark.usefixtures("acme")
def test_a_failed_send_goes_back_to_pending_for_a_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crossing_id = _one_crossing()

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise ConnectionRefusedError("smtp down")

    with monkeypatch.context() as patch:
        patch.setattr("django.core.mail.EmailMultiAlternatives.send", refuse)
        with pytest.raises(ConnectionRefusedError):
            thresholds.threshold_warning_send(crossing_id)
    crossing = ThresholdCrossing.objects.get()
    assert (crossing.state, crossing.last_error) == (
        DeliveryState.PENDING,
        "ConnectionRefusedError: smtp down",
    )
    assert thresholds.threshold_warning_send(crossing_id) == DeliveryState.SENT
    assert len(mail.outbox) == 1


class _Null:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_concurrent_scans_and_senders_email_once(acme: None) -> None:
    budgets.status(tenant="acme")  # warm the tenant
    reserve_30()
    reserve_30()

    def scan_and_send(_: int) -> list[str]:
        thresholds.thresholds_scan()
        return [thresholds.threshold_warning_send(i) for i in thresholds.thresholds_due()]

    results = run_threads(6, scan_and_send)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert _crossings() == [(50, DeliveryState.SENT)]
    assert len(mail.outbox) == 1


@pytest.mark.usefixtures("acme")
def test_a_budget_threshold_below_every_default_is_still_found() -> None:
    Budget.objects.update(warning_thresholds=[20])
    reserve_30()  # 30 %: below the default 50 %, above this budget's 20 %
    thresholds.thresholds_scan()
    assert _crossings() == [(20, DeliveryState.PENDING)]


@override_settings(LLM_BUDGETS={"WARNING_THRESHOLDS": []})
@pytest.mark.usefixtures("acme")
def test_no_thresholds_anywhere_scans_nothing() -> None:
    for _ in range(3):
        reserve_30()
    assert thresholds.thresholds_scan() == []


def test_each_end_user_budget_warns_per_end_user() -> None:
    price_fake()
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.test")
    budgets.set_limit(tenant="acme", end_user="*", amount=Decimal(50), window="month")
    reserve_30(end_user="u-1")  # 60 % of u-1's own 50
    reserve_30(end_user="u-2")
    _scan_job()
    crossings = ThresholdCrossing.objects.order_by("end_user__external_id")
    assert [(c.end_user.external_id, c.threshold, c.state) for c in crossings] == [  # type: ignore[union-attr]
        ("u-1", 50, DeliveryState.SENT),
        ("u-2", 50, DeliveryState.SENT),
    ]
    assert sorted("acme/u-1" in m.body for m in mail.outbox) == [False, True]


def test_a_rolling_budget_warns_on_its_whole_window_and_re_arms_each_window_length() -> None:
    start = datetime(2026, 3, 10, 12, tzinfo=UTC)
    price_fake(effective_from=start - timedelta(days=1))
    budgets.ensure_tenant(tenant="acme", billing_emails="billing@acme.test")
    budgets.set_limit(tenant="acme", amount=Decimal(100), window="rolling:1h")
    # Two holds in different buckets: each bucket holds 30 %, the window 60 %.
    reserve_30_at(start)
    reserve_30_at(start + timedelta(minutes=10))
    assert thresholds.thresholds_scan(now=start + timedelta(minutes=11))
    assert thresholds.thresholds_scan(now=start + timedelta(minutes=30)) == []
    # The next hour-long span re-arms it: the first hold has left the window, the second and a
    # new one make 60 % again.
    reserve_30_at(start + timedelta(minutes=61))
    new = thresholds.thresholds_scan(now=start + timedelta(minutes=62))
    assert [c.threshold for c in ThresholdCrossing.objects.filter(pk__in=new)] == [50]
    assert ThresholdCrossing.objects.count() == 2


def test_each_run_of_a_run_star_budget_is_warned_about_once() -> None:
    """Issue #16: an each-run budget's runs cross its thresholds each on their own counter,
    so each gets its own warning, naming the run."""
    seed(limit="1000")
    billing_contacts("billing@acme.test")
    budgets.set_limit(tenant="acme", run="*", amount=Decimal("60"), window="lifetime")
    for run in ("r1", "r2"):
        reserve_30(run=run)
    _scan_job()
    runs = ThresholdCrossing.objects.order_by("run__external_id").values_list(
        "run__external_id", "threshold"
    )
    assert list(runs) == [("r1", 50), ("r2", 50)]
    assert sorted(
        "run r1 of acme" in m.body or "run r2 of acme" in m.body for m in mail.outbox
    ) == [
        True,
        True,
    ]
    _scan_job()
    assert len(mail.outbox) == 2


@pytest.mark.usefixtures("application_clock")
def test_a_projected_overrun_is_warned_once_and_only_where_the_plan_opts_in() -> None:
    import time_machine

    # 3.00 a day for a week against a month of 60: at that rate it runs out on 21 Nov.
    for day in range(1, 8):
        with time_machine.travel(datetime(2026, 11, day, 12, tzinfo=UTC), tick=False):
            if day == 1:
                seed(limit="60")
                billing_contacts("billing@acme.test")
            reserve_30().commit(input_tokens=0, output_tokens=100)
    with time_machine.travel(datetime(2026, 11, 8, 9, tzinfo=UTC), tick=False):
        _scan_job()
        plan = Plan.objects.create(name="growth")
        Tenant.objects.filter(external_id="acme").update(plan=plan)
        _scan_job()
        # Off by default, without a plan or with one (21 of 60 reaches no threshold either).
        assert ThresholdCrossing.objects.count() == 0
        plan.warn_projected = True
        plan.save()
        for _ in range(3):
            _scan_job()
            call_command("llm_budgets_warnings", stdout=_Null())
    [crossing] = ThresholdCrossing.objects.all()
    assert (crossing.kind, crossing.threshold, crossing.state) == ("projected", 100, "sent")
    assert crossing.runs_out_at is not None
    assert crossing.runs_out_at.date() == datetime(2026, 11, 21).date()
    [message] = mail.outbox
    assert "projected to run out before it resets" in message.subject
    assert "will use all of its month LLM budget" in message.body
    assert "21 Nov 2026" in message.body or "2026-11-21" in message.body


@pytest.mark.usefixtures("application_clock")
def test_a_projected_warning_does_not_stand_for_the_limit_reached_later() -> None:
    """The projected warning is recorded at threshold 100 of its own kind: reaching the limit
    later in the period still records and sends the 100% warning."""
    import time_machine

    for day in range(1, 8):
        with time_machine.travel(datetime(2026, 11, day, 12, tzinfo=UTC), tick=False):
            if day == 1:
                seed(limit="60")
                billing_contacts("billing@acme.test")
                plan = Plan.objects.create(name="growth", warn_projected=True)
                Tenant.objects.filter(external_id="acme").update(plan=plan)
            reserve_30().commit(input_tokens=0, output_tokens=100)
    with time_machine.travel(datetime(2026, 11, 8, 9, tzinfo=UTC), tick=False):
        _scan_job()
        assert list(ThresholdCrossing.objects.values_list("kind", "threshold")) == [
            ("projected", 100)
        ]
    with time_machine.travel(datetime(2026, 11, 20, 9, tzinfo=UTC), tick=False):
        budgets.set_limit(tenant="acme", amount=Decimal("21"), window="month")  # 21 of 21 now
        _scan_job()
    reached = ThresholdCrossing.objects.filter(kind="threshold").order_by("threshold")
    assert reached.values_list("threshold", flat=True).last() == 100
