"""A real HTTP receiver of alert webhooks on 127.0.0.1, for tests/test_alerts*.py: it verifies
each signature, stores each delivery id once (as a receiver should), and answers as a test
scripts it (500s, a 429 with Retry-After, a slow answer, a redirect)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from llm_budgets.alerts import SignatureInvalid, verify
from llm_budgets.testing.fakes.server import serve_in_background


@dataclass
class Stored:
    delivery: str
    event: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Receiver:
    secrets: list[str] = field(default_factory=list)
    stored: list[Stored] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # every delivery id received, repeats too
    refused_signatures: int = 0
    # Scripted answers, consumed one per request: (status, headers, delay seconds).
    script: list[tuple[int, dict[str, str], float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)
    port: int = 0
    # Called with the delivery id once a new one is stored, before the answer goes out.
    on_store: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def wait_for(self, count: int, timeout: float = 30) -> list[Stored]:
        """Block until ``count`` deliveries are stored (a condition, not a sleep)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.stored) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"stored {len(self.stored)} of {count} deliveries")
                self.changed.wait(left)
            return list(self.stored)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            delivery = self.headers.get("LLM-Budgets-Delivery", "")
            with receiver.lock:
                status, extra, delay = receiver.script.pop(0) if receiver.script else (200, {}, 0)
            if receiver.secrets:
                try:
                    verify(body, self.headers.get("LLM-Budgets-Signature"), receiver.secrets)
                except SignatureInvalid:
                    with receiver.lock:
                        receiver.refused_signatures += 1
                    status = 400
            if status == 200:
                with receiver.changed:
                    receiver.seen.append(delivery)
                    new = delivery not in {s.delivery for s in receiver.stored}
                    if new:
                        receiver.stored.append(
                            Stored(delivery, json.loads(body), dict(self.headers.items()))
                        )
                    receiver.changed.notify_all()
                if new and receiver.on_store is not None:
                    receiver.on_store(delivery)
            if delay:
                time.sleep(delay)  # the receiver's own slowness, scripted
            self.send_response(status)
            flood = int(extra.pop("X-Flood", "0"))
            for name, value in extra.items():
                self.send_header(name, value)
            if flood:
                # An answer far longer than it sends before going silent: only a reader that
                # stops at its cap gets through.
                self.send_header("Content-Length", str(flood * 100))
                self.end_headers()
                self.wfile.write(b"x" * flood)
                self.wfile.flush()
                time.sleep(3)
                return
            answer = b'{"ok": true}' if status == 200 else b"nope"
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    return Handler


@contextmanager
def receiver_running(secrets: list[str] | None = None) -> Iterator[Receiver]:
    receiver = Receiver(secrets=list(secrets or []))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.port = int(server.server_address[1])
    serve_in_background(server)
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
