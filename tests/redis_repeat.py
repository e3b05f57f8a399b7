"""Repeat Redis outages against one real Celery worker, many times (issue #17; docs/reliability.md).

    python -m tests.redis_repeat CYCLES [--seed N] [--faults ack,refuse-reset,reset,stall,silent]

The worker runs the project's settings (``DJANGO_SETTINGS_MODULE``, default project.settings)
through the fault proxy to Redis (``LLMB_TEST_REDIS_URL``). Each cycle applies one fault, heals,
publishes a task straight to Redis and waits (bounded) until the worker has received it. The task
is of a type the worker does not know: receiving it is the proof, no database is needed.

- ``ack``: Redis goes down (every connection reset, new ones refused) as the worker
  acknowledges a task, before or after the ack reaches Redis; a publish through the proxy fails;
  then a random wait before healing;
- ``refuse-reset``: refuse, reset, a publish through the proxy fails, heal;
- ``reset``: reset, heal at once and publish in the same instant;
- ``stall``: nothing forwarded for up to 4 s;
- ``silent``: bytes dropped both ways for 1 to 4 s, connections left open.

Each cycle ends *received*, *lost* (the queue is empty but the worker never received the task:
Redis popped it for a connection that died) or *stuck* (still queued: the worker is dead or does
not consume); stuck ends the run.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import redis
from kombu import Connection, Producer

from llm_budgets.testing.faultproxy import FaultProxy
from tests.services import REDIS_URL

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("ack", "refuse-reset", "reset", "stall", "silent")
RECEIVED = b"Received unregistered task"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cycles", type=int)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait a cycle")
    args = parser.parse_args()
    faults = args.faults.split(",")
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults: {sorted(unknown)}")
    chooser = random.Random(args.seed)
    host, port = REDIS_URL.split("//", 1)[1].split("/", 1)[0].split(":")
    database = REDIS_URL.rsplit("/", 1)[1]
    direct = redis.Redis.from_url(REDIS_URL)
    queue = f"llmb-repeat-{uuid.uuid4().hex[:8]}"
    outcomes: Counter[str] = Counter()
    log_path = Path(tempfile.mkdtemp()) / "worker.log"
    with FaultProxy(host, int(port)) as proxy, log_path.open("wb") as log:
        through = f"redis://127.0.0.1:{proxy.port}/{database}"
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "project", "worker", "--pool=solo"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                f"--hostname={queue}@%h",
                f"--queues={queue}",
                "--loglevel=INFO",
            ],
            env={
                **os.environ,
                "CELERY_BROKER_URL": through,
                "CELERY_TASK_ALWAYS_EAGER": "false",
                "CELERY_TASK_DEFAULT_QUEUE": queue,
                "PYTHONUNBUFFERED": "1",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        print(f"worker {worker.pid}, log {log_path}", flush=True)

        def publish(url: str) -> None:
            with Connection(url, transport_options={"max_retries": 1}) as connection:
                Producer(connection).publish(
                    {},
                    routing_key=queue,
                    headers={"task": "repeat.unknown", "id": uuid.uuid4().hex},
                )

        def received() -> int:
            return log_path.read_bytes().count(RECEIVED)

        def wait_received(count: int) -> str:
            deadline = time.monotonic() + args.bound
            while time.monotonic() < deadline:
                if received() >= count:
                    return "received"
                time.sleep(0.1)  # polling, bounded by the deadline
            return "stuck" if direct.llen(queue) else "lost"

        try:
            publish(REDIS_URL)
            if wait_received(1) != "received":
                print("the worker never started consuming", flush=True)
                return 2
            for cycle in range(args.cycles):
                fault = chooser.choice(faults)
                started = time.monotonic()
                expected = received() + 1
                if fault == "ack":
                    before = chooser.random() < 0.5
                    fault = f"ack ({'before' if before else 'after'} it reached Redis)"
                    ack = proxy.cut_when_client_sends(b"ZREM", before=before, outage=True)
                    publish(REDIS_URL)
                    if not ack.wait(args.bound):
                        print("no ack seen", flush=True)
                        return 2
                    expected += 1
                if fault.startswith("ack") or fault == "refuse-reset":
                    proxy.refuse()
                    proxy.reset()
                    try:
                        publish(through)
                        print("a publish through a refusing proxy went through", flush=True)
                        return 2
                    except Exception:  # expected: Redis is down
                        pass
                    time.sleep(chooser.uniform(0, 3))  # the outage lasts a while
                elif fault == "reset":
                    proxy.reset()
                elif fault == "stall":
                    proxy.stall()
                    time.sleep(chooser.uniform(0, 4))
                elif fault == "silent":
                    proxy.blackhole()
                    time.sleep(chooser.uniform(1, 4))
                proxy.heal()
                publish(REDIS_URL)
                outcome = wait_received(expected)
                outcomes[outcome] += 1
                print(
                    f"cycle {cycle}: {fault}: {outcome} in {time.monotonic() - started:.1f}s",
                    flush=True,
                )
                if outcome == "stuck":
                    break
        finally:
            alive = worker.poll() is None
            if alive:
                worker.terminate()
                worker.wait(60)
            direct.delete(queue, *direct.scan_iter(match=f"_kombu.binding*.{queue}"))
    print(
        f"{sum(outcomes.values())} cycles: {dict(outcomes)}; faults {dict(proxy.counts)}; "
        f"worker {'alive' if alive else 'dead'} at the end",
        flush=True,
    )
    return 0 if outcomes["stuck"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
