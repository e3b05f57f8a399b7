"""Alert delivery by a real Celery worker on Redis (issue 28, item 5): a worker SIGKILLed after
the receiver stored a delivery and before the answer reached it; the task, acknowledged late, is
done again by another worker once the endpoint's lease lapses, and the receiver gets that
delivery once more (same delivery id: stored once) and the rest once each, in order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from llm_budgets import budgets
from llm_budgets.alerts.endpoints import endpoint_create
from llm_budgets.models import AlertDelivery, AlertDeliveryState, Tenant
from tests.alerts_receiver import receiver_running
from tests.celery_processes import celery_processes
from tests.factories import seed
from tests.services import redis_ping, require

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

BOUND = 120.0  # seconds: a bound on waiting for an outcome, never a timing assertion
VISIBILITY = 3  # seconds before a killed worker's task is delivered again


def wait_for(condition: Callable[[], bool], what: str, tick: Callable[[], None]) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND}s: {what}")
        tick()
        time.sleep(1)  # polling for an outcome (and beat's next run), bounded by the deadline


def test_a_worker_killed_mid_delivery_redelivers_that_one_once(
    tmp_path: Path, settings: Any
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("workers in other processes need a shared database")
    require("Redis", redis_ping)
    local: dict[str, Any] = {
        **settings.LLM_BUDGETS,
        "ALERTS_ALLOW_HTTP": True,
        "ALERTS_ALLOWED_ADDRESSES": ["127.0.0.1"],
        "ALERTS_TIMEOUT_SECONDS": 1,  # the killed sender's lease lapses 7 s later
    }
    settings.LLM_BUDGETS = local
    seed()
    with receiver_running() as receiver:
        endpoint_create(
            tenant=Tenant.objects.get(external_id="acme"),
            kind="webhook",
            target=receiver.url,
            event_types=["run.closed"],
        )
        for n in range(3):
            budgets.close_run(tenant="acme", run=f"run-{n}", actor="alice")
        expected = list(AlertDelivery.objects.order_by("pk").values_list("uid", flat=True))
        with celery_processes(
            tmp_path,
            DJANGO_SETTINGS_MODULE="tests.server_settings",
            LLMB_TEST_LLM_BUDGETS=json.dumps(local),
            CELERY_VISIBILITY_TIMEOUT=VISIBILITY,
        ) as celery:
            killed: list[str] = []
            done = threading.Event()

            def kill_sender(delivery: str) -> None:
                if not killed:
                    celery.kill("first")  # dead before the receiver's answer reaches it
                    killed.append(delivery)
                    done.set()

            receiver.on_store = kill_sender
            celery.worker("first", pool="prefork")
            celery.send("llm_budgets.deliver_alerts")
            assert done.wait(BOUND), celery.log("first")
            assert killed == [expected[0]]
            receiver.on_store = None
            assert AlertDelivery.objects.get(uid=expected[0]).state == AlertDeliveryState.PENDING
            celery.worker("second")
            # The redelivered task, then beat's next runs: the lease lapses, the rest goes.
            wait_for(
                lambda: not AlertDelivery.objects.filter(state=AlertDeliveryState.PENDING).exists(),
                "every delivery delivered",
                lambda: celery.send("llm_budgets.deliver_alerts"),
            )
    assert [s.delivery for s in receiver.stored] == expected  # once each, in order
    assert receiver.seen.count(expected[0]) == 2  # the killed one, sent once more
    assert [receiver.seen.count(uid) for uid in expected[1:]] == [1, 1]
    assert AlertDelivery.objects.get(uid=expected[0]).attempts == 2
