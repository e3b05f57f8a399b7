"""The web process's gunicorn configuration; the Dockerfile runs ``gunicorn -c
project/gunicorn.conf.py project.wsgi:application`` (docs/reliability.md, "Serving shape").

- Threaded workers (``gthread``): a slow client holds one thread, not a whole process, and a
  connection that has sent nothing yet waits in the worker's poller without a thread at all.
- Each request's body is read within ``REQUEST_BODY_TIMEOUT`` seconds (``project.serving``): a
  client that declares a body and never sends it is answered 408 and its thread freed.
- ``WEB_CONCURRENCY`` processes x ``GUNICORN_THREADS`` threads is both how many requests run at
  once and how many database connections the process may hold (CONN_MAX_AGE keeps one per
  thread): keep it within PostgreSQL's ``max_connections`` (or a pooler's) across every web
  container.
- Once a worker has loaded the application, the objects it holds for good (Django, the URL
  conf, the models) are frozen out of the garbage collector's reach (``gc.freeze``): a full
  collection then walks only what requests made, not the whole framework, which took the tenant
  pages' 95th percentile from ~200 to ~130 ms (docs/performance.md, "Tenant pages").
"""

from __future__ import annotations

import gc
import os
from typing import Any

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
# A worker takes a connection only when one of its threads is free, so a request never queues
# behind slow clients inside a worker while another worker idles; the rest wait in the listen
# backlog for the first free thread of any worker. (No keep-alive then: every connection is one
# request. A proxy in front keeps its own keep-alive to clients.)
worker_connections = threads
keepalive = 0
timeout = 30  # a worker whose main loop is stuck this long is restarted
graceful_timeout = 30

REQUEST_BODY_TIMEOUT = float(os.environ.get("REQUEST_BODY_TIMEOUT", "10"))
REQUEST_BODY_MAX_BYTES = int(os.environ.get("REQUEST_BODY_MAX_BYTES", str(16 * 1024 * 1024)))


def post_worker_init(worker: Any) -> None:
    """Wrap the application each worker loaded with the body deadline; freeze what it loaded."""
    from project.serving import BodyDeadline

    worker.wsgi = BodyDeadline(
        worker.wsgi, seconds=REQUEST_BODY_TIMEOUT, max_bytes=REQUEST_BODY_MAX_BYTES
    )
    gc.collect()
    gc.freeze()
