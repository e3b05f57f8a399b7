"""The Celery worker's consumer, for hosts on Redis: in the Celery settings,
``CELERY_WORKER_CONSUMER = "llm_budgets.celery_worker:Consumer"`` (docs/operations.md).

A module of its own so that only the worker imports it: web processes load the host's Celery app
but never Celery's worker machinery. Needs the ``celery`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

logger = logging.getLogger(__name__)


class Consumer(CeleryConsumer):
    """Celery's consumer, except that closing the lost broker connection cannot kill the worker.

    Celery 5.7 with kombu 5.7 on Redis: when the connection is lost while the worker holds an
    unacknowledged message (a late-acked task whose ack failed), ``Connection.collect()`` can
    leave the task channel open (likely: its close re-raises a pending BRPOP's connection error,
    and the transport stops at the next channel that fails to close) while it detaches the
    transport. The ``close()`` Celery calls next closes that channel, whose requeue of the
    unacknowledged message needs the detached transport: an ``AttributeError``, which Celery
    calls unrecoverable, and the worker exits (docs/reliability.md). Skipping the requeue loses
    nothing: unless its ack reached Redis, the message is still in Redis's unacked set and is
    delivered again after the visibility timeout.
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            connection.close = _closing_leniently(connection, connection.close)
        super().on_connection_error_after_connected(exc)


def _closing_leniently(connection: Any, close: Callable[[], Any]) -> Callable[[], Any]:
    def close_leniently() -> Any:
        try:
            return close()
        except AttributeError:
            # Only the detached transport's error is forgiven (see Consumer): with a transport
            # still attached, an AttributeError is some other bug, and Celery decides.
            if getattr(connection, "_transport", None) is not None:
                raise
            logger.warning(
                "Closing the lost broker connection failed; its unacknowledged messages stay in "
                "Redis and are delivered again after the visibility timeout",
                exc_info=True,
            )
            return None

    return close_leniently
