"""Celery under faults (issue #17, items 1 and 3), with real workers on Redis:

- a worker killed with SIGKILL in the middle of the sweep (inside its transaction, held there by
  the fault proxy in front of PostgreSQL) leaves nothing half-done, and the task, acknowledged
  late, is delivered again to another worker after the visibility timeout and done once;
- the same for a Stripe push killed after Stripe recorded an event and before the outbox did;
- Redis (the broker) down at the worker's acknowledgement, refused and reset, stalled, and
  silent, through the fault proxy: admission does not use it and keeps both admitting and
  refusing; a task cannot be published while it is down (an error, not a silent loss or a hang);
  the worker reconnects by itself when it is back, no restart;
- beat down for an hour (time travel through celery's own scheduler): each job runs once on the
  restart, not once per missed interval, and that one run catches up everything due.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.utils import timezone

from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.jobs.reconcile import counters_drift
from llm_budgets.models import (
    DeliveryState,
    MeterDelivery,
    MeterDeliveryState,
    Reservation,
    ReservationState,
    ThresholdCrossing,
    UsageRecord,
)
from llm_budgets.schedule import BEAT_SCHEDULE, JOBS
from llm_budgets.testing.faultproxy import FaultProxy
from tests.celery_processes import celery_processes
from tests.factories import billing_contacts, reserve_30, reserve_30_at, seed
from tests.services import REDIS_URL, redis_ping, require, subprocess_database_url

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

BOUND = 120.0  # seconds: a bound on waiting for an outcome, never a timing assertion
VISIBILITY = 3  # seconds before a killed worker's task is delivered again (the test's setting)
VAR = Path(__file__).resolve().parent.parent / "var"


def wait_for(condition: Callable[[], bool], what: str, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound}s: {what}")
        time.sleep(0.2)  # polling for an outcome, bounded by the deadline


def record(name: str, counts: dict[str, Any]) -> None:
    VAR.mkdir(exist_ok=True)
    (VAR / f"faults-{name}.json").write_text(json.dumps(counts, indent=2, sort_keys=True))


def _on_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fault proxy sits in front of PostgreSQL")
    require("Redis", redis_ping)


def _through(proxy: FaultProxy) -> str:
    url = subprocess_database_url()
    db = connection.settings_dict
    return url.replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/")


def _expired_once(ids: list[Any]) -> bool:
    return all(
        Reservation.objects.get(pk=pk).state == ReservationState.EXPIRED for pk in ids
    ) and UsageRecord.objects.filter(reservation_id__in=ids).count() == len(ids)


def test_a_worker_killed_mid_sweep_leaves_nothing_half_done_and_the_redo_expires_once(
    tmp_path: Path,
) -> None:
    _on_postgres()
    seed(limit="100")
    past = timezone.now() - timedelta(minutes=5)
    overdue = [reserve_30_at(past, ttl=1).id for _ in range(2)]  # type: ignore[attr-defined]
    db = connection.settings_dict
    with (
        FaultProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as proxy,
        celery_processes(tmp_path, CELERY_VISIBILITY_TIMEOUT=VISIBILITY) as celery,
    ):
        # The first ledger line the sweep writes is held: the worker is inside the expiry's
        # transaction (counter locked, reservation updated, nothing committed).
        held = proxy.stall_when_client_sends(b"llm_budgets_usagerecord")
        celery.worker("first", pool="prefork", DATABASE_URL=_through(proxy))
        celery.send("llm_budgets.sweep_expired_holds")
        assert held.wait(BOUND), celery.log("first")
        celery.kill("first")
        wait_for(lambda: not proxy._all_pairs(), "PostgreSQL saw the killed worker go")
        proxy.heal()
        # Rolled back: both holds still held, no ledger line, counters as before.
        assert {Reservation.objects.get(pk=pk).state for pk in overdue} == {ReservationState.HELD}
        assert UsageRecord.objects.count() == 0
        assert counters_drift() == []
        # Acknowledged late: another worker gets the same task after the visibility timeout.
        celery.worker("second")
        wait_for(lambda: _expired_once(overdue), "the redelivered sweep expired both holds")
        assert "sweep_expired_holds" in celery.log("second")
    assert UsageRecord.objects.count() == 2  # one expiry charge each, never two
    assert counters_drift() == []
    record("celery-kill-sweep", {"kills": 1, "redeliveries": 1, "holds": 2, **proxy.counts})


def test_a_worker_killed_mid_stripe_push_bills_each_fact_once(
    tmp_path: Path, settings: Any
) -> None:
    """Killed after Stripe recorded the first event, before the outbox knew: the redelivered
    push sends the others, and the first once its lease ends (Stripe answers "already have it")."""
    _on_postgres()
    from llm_budgets.billing.stripe_push import deliveries_build, hour_of, stripe_push
    from llm_budgets.testing.fakes.stripe_server import MeterEvent, StripeServer
    from tests.stripe_support import ledger_units, set_up, stripe_settings

    with StripeServer() as fake:
        settings.LLM_BUDGETS = stripe_settings(fake.base_url)
        settings_json = json.dumps(settings.LLM_BUDGETS)
        first = hour_of(timezone.now()) - timedelta(hours=4)
        for index in range(3):
            with time_machine.travel(first + timedelta(hours=index, minutes=5), tick=False):
                if index == 0:
                    set_up(fake)
                reserve_30().commit(input_tokens=0, output_tokens=100 + index)
        assert deliveries_build() == 3
        with celery_processes(
            tmp_path,
            DJANGO_SETTINGS_MODULE="tests.server_settings",
            LLMB_TEST_LLM_BUDGETS=settings_json,
            CELERY_VISIBILITY_TIMEOUT=VISIBILITY,
        ) as celery:
            killed: list[MeterEvent] = []

            def kill_sender(event: MeterEvent) -> None:
                if not killed:
                    celery.kill("first")  # dead before Stripe answers
                    killed.append(event)

            fake.on_record = kill_sender
            celery.worker("first", pool="prefork")
            celery.send("llm_budgets.stripe_push")
            wait_for(lambda: bool(killed), "the worker was killed mid-push")
            fake.on_record = None
            assert len(fake.state.events) == 1
            celery.worker("second")
            wait_for(
                lambda: MeterDelivery.objects.filter(state=MeterDeliveryState.SENT).count() == 2,
                "the redelivered push sent the other two",
            )
        # The killed sender's lease (5 minutes) ends; the next push finds it at Stripe.
        assert stripe_push(now=timezone.now() + timedelta(minutes=6)).sent == 1
        identifiers = [e.identifier for e in fake.state.events]
        assert len(identifiers) == len(set(identifiers)) == 3
        assert set(MeterDelivery.objects.values_list("state", flat=True)) == {
            MeterDeliveryState.SENT
        }
        customer = MeterDelivery.objects.first().customer_id  # type: ignore[union-attr]
        assert abs(fake.total(customer) - ledger_units()) <= 1
    record("celery-kill-stripe", {"kills": 1, "deliveries": 3, "events at Stripe": 3})


def test_redis_down_or_stalled_never_widens_spending_and_the_worker_recovers_by_itself(
    tmp_path: Path,
) -> None:
    """The worker runs the project's settings (project/settings.py: socket timeouts, health
    checks, endless reconnection, llm_budgets.celery_worker.Consumer), the producer its transport
    options."""
    _on_postgres()
    import kombu.exceptions
    import redis.exceptions

    seed(limit="400")  # each leg's overdue hold is charged 30 when the worker expires it
    host, port = REDIS_URL.split("//", 1)[1].split("/", 1)[0].split(":")
    database = REDIS_URL.rsplit("/", 1)[1]
    with FaultProxy(host, int(port)) as proxy:
        broker = f"redis://127.0.0.1:{proxy.port}/{database}"
        with celery_processes(tmp_path, CELERY_BROKER_URL=broker) as celery:
            celery.worker()
            # Up: a task goes through the proxy and is done. Redis goes down (every connection
            # reset, new ones refused) as the worker acknowledges it (the ack reaches Redis, its
            # answer does not): the worker loses the connection holding an unacknowledged
            # message, the instant a CI run once hit by chance and the worker exited on
            # (docs/reliability.md, "Bugs the suite found").
            ack = proxy.cut_when_client_sends(b"ZREM", before=False, outage=True)
            first = reserve_30_at(timezone.now() - timedelta(minutes=5), ttl=1)
            celery.send("llm_budgets.sweep_expired_holds", broker)
            wait_for(lambda: _expired_once([first.id]), "the sweep ran")  # type: ignore[attr-defined]
            assert ack.wait(BOUND), celery.log("worker")

            outages: dict[str, tuple[Callable[[], None], ...]] = {
                "down at an acknowledgement": (),  # down already
                "refused and reset": (proxy.refuse, proxy.reset),
                "stalled": (proxy.stall,),
                # Bytes read and dropped both ways: connections stay open and go silent (a
                # partition); only the socket timeouts and kombu's health checks end them.
                "silent": (proxy.blackhole,),
            }
            publish_errors = 0
            for name, faults in outages.items():
                for fault in faults:
                    fault()
                # Admission does not use Redis: it admits within the limit and refuses past it.
                hold = reserve_30()
                with pytest.raises(BudgetExceeded):
                    reserve_30(max_output_tokens=30000)  # 900 more: past the limit of 400
                hold.release()
                if name != "stalled":  # a publish while down is an error, not a loss or a hang
                    with pytest.raises(
                        (kombu.exceptions.OperationalError, redis.exceptions.RedisError)
                    ):
                        celery.send("llm_budgets.sweep_expired_holds", broker)
                    publish_errors += 1
                overdue = reserve_30_at(timezone.now() - timedelta(minutes=5), ttl=1)
                proxy.heal()
                # Back: the same worker (never restarted) takes the next task.
                celery.send("llm_budgets.sweep_expired_holds", broker)
                wait_for(
                    lambda o=overdue: _expired_once([o.id]),  # type: ignore[attr-defined]
                    f"the worker recovered after Redis was {name}",
                )
                assert celery.processes["worker"].poll() is None, celery.log("worker")
    assert counters_drift() == []
    record(
        "redis",
        {"outages": len(outages), "publish errors": publish_errors, **proxy.counts},
    )


# -- beat down for an hour -------------------------------------------------------------------


def test_beat_down_for_an_hour_runs_each_job_once_on_restart_and_loses_nothing() -> None:
    """Celery's own scheduler, moved through time: beat ticks, stops for an hour, restarts with
    the schedule it had (as django-celery-beat's rows or the shelve keep it). Each job is sent
    once at the restart, not once per missed interval (120 sweeps): that bounds the catch-up. The
    sent jobs, run, settle everything that fell due during the hour: overdue holds expired and
    charged once, the warning crossed during the hour sent once."""
    from celery import Celery
    from celery.beat import Scheduler

    seed(limit="300")
    billing_contacts("billing@acme.test")
    # The hour happened in the past: the sweep decides "overdue" on the database's clock, which
    # time_machine does not move, so the holds must be overdue by it when the jobs run.
    start = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    app = Celery("beat-test", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = BEAT_SCHEDULE
    app.conf.timezone = "UTC"

    class Recording(Scheduler):
        sent: list[str] = []

        def apply_async(self, entry: Any, *args: Any, **kwargs: Any) -> None:
            self.sent.append(entry.task)

    def tick_for(scheduler: Scheduler, seconds: int) -> list[str]:
        """Tick as beat does (each tick says how long to sleep), for ``seconds`` of the clock."""
        Recording.sent = []
        deadline = timezone.now() + timedelta(seconds=seconds)
        while timezone.now() < deadline:
            sleep = scheduler.tick()
            traveller.shift(min(max(sleep, 0.05), 60.0))  # as beat sleeps (0: more are due)
        return [task for task in Recording.sent if task.startswith("llm_budgets.")]

    with time_machine.travel(start, tick=False) as traveller:
        beat = Recording(app=app, lazy=False)
        before = tick_for(beat, 120)  # two minutes of normal running
        assert before.count("llm_budgets.sweep_expired_holds") >= 3  # every 30 s
        # Beat goes down. During the hour: holds fall overdue, 60 % of the budget is taken.
        last_run = {name: entry.last_run_at for name, entry in beat.schedule.items()}
        holds = []
        for minute in range(5, 60, 10):
            traveller.move_to(start + timedelta(minutes=minute))
            holds.append(reserve_30_at(timezone.now(), ttl=60).id)  # type: ignore[attr-defined]
        traveller.move_to(start + timedelta(hours=1, minutes=2))
        # Beat restarts with the schedule as it was persisted.
        restarted = Recording(app=app, lazy=False)
        for name, entry in restarted.schedule.items():
            entry.last_run_at = last_run[name]
        first_tick = tick_for(restarted, 1)
        # Each job due once, whatever the downtime: the hourly and daily ones were not yet due.
        assert sorted(first_tick) == sorted(job.task for job in JOBS if job.every <= 60 * 60)
        assert first_tick.count("llm_budgets.sweep_expired_holds") == 1
        # Running what was sent settles the hour's backlog.
        for task in first_tick:
            app_task = _task(task)
            app_task.apply().get()
    assert {Reservation.objects.get(pk=pk).state for pk in holds} == {ReservationState.EXPIRED}
    assert UsageRecord.objects.filter(reservation_id__in=holds).count() == len(holds)
    crossings = ThresholdCrossing.objects.all()
    assert [(c.threshold, c.state) for c in crossings] == [(50, DeliveryState.SENT)]
    assert len(mail.outbox) == 1
    assert counters_drift() == []
    record(
        "beat-downtime",
        {"downtime minutes": 62, "jobs sent at restart": len(first_tick), "holds": len(holds)},
    )


def _task(name: str) -> Any:
    import llm_budgets.tasks  # noqa: F401  (registers the shared tasks)
    from project.celery import app

    return app.tasks[name]
