"""Real concurrency: threads or processes released together by a barrier, each on its own
database connection. Used only by tests marked ``django_db(transaction=True)``."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def run_threads(count: int, work: Callable[[int], Any], *, timeout: float = 60) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads started at the same instant. Returns each result or
    the exception it raised, in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def target(index: int) -> None:
        try:
            barrier.wait(timeout)
            results[index] = work(index)
        except BaseException as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    return results


def _process_target(work: Callable[[int], Any], index: int, barrier: Any, queue: Any) -> None:
    # A forked child must not reuse the parent's sockets: drop them unclosed and reconnect.
    for conn in connections.all(initialized_only=True):
        conn.connection = None
    try:
        barrier.wait(60)
        queue.put((index, "ok", work(index)))
    except BaseException as exc:
        queue.put((index, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def run_processes(
    count: int, work: Callable[[int], Any], *, timeout: float = 120
) -> list[tuple[str, Any]]:
    """Run ``work(i)`` in ``count`` forked processes started together. Returns ``(status, value)``
    per index, where status is ``"ok"`` or ``"error"`` (value: the exception's name and text)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(count)
    queue = context.Queue()
    connections.close_all()
    processes = [
        context.Process(target=_process_target, args=(work, i, barrier, queue))
        for i in range(count)
    ]
    for process in processes:
        process.start()
    results: list[tuple[str, Any]] = [("error", "no result")] * count
    for _ in range(count):
        index, status, value = queue.get(timeout=timeout)
        results[index] = (status, value)
    for process in processes:
        process.join(timeout)
    return results
