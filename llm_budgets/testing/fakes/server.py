"""A fake provider: a real HTTP server on 127.0.0.1 (port 0) that records each request and answers
as told: JSON, SSE streams (fast or slow), HTTP errors, a stall, a dropped connection. It reports
whether the client closed a stream before its end, so a test can prove upstream was closed."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT = 10.0  # the bound on every wait in the fakes and their tests

# How often a serving loop looks for ``shutdown()``, which waits until it does: the default half
# second was paid by every test that stops a server (minutes of each CI leg).
POLL_SECONDS = 0.02


def serve_in_background(server: socketserver.BaseServer) -> threading.Thread:
    """Serve ``server`` on a daemon thread that notices ``shutdown()`` within
    :data:`POLL_SECONDS`."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
    )
    thread.start()
    return thread


@dataclass
class Behaviour:
    """What the next request gets. ``kind``: ok | status | stall | drop (connection closed after
    ``chunks`` chunks of a stream, or before any answer)."""

    kind: str = "ok"
    status: int = 200
    chunks: int = 3  # output deltas in a stream
    delay: float = 0.0  # seconds between stream chunks
    text: str = "Hello from the fake. "
    finish_reason: str = "stop"
    stall_after: int | None = None  # stop sending after this many stream events, until unstall
    usage: bool = True  # False: a stream ends without its final usage
    # A caller that stops early: send this many text deltas, then nothing more until the client
    # closes (so what was sent, and billed, does not depend on how fast the client reads).
    cut_after_text: int | None = None


@dataclass
class Seen:
    """One request as the fake received it, and how its answer went."""

    path: str
    body: dict[str, Any]
    chunks_sent: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    # What the provider bills for this request (``bills.Bill``; realistic fakes), once finished.
    bill: Any = None
    plan: Any = None  # a realistic fake's plan of its answer
    # The visible text the stream sent before it ended or was cut.
    text_sent: str = ""
    finished: threading.Event = field(default_factory=threading.Event)
    client_closed: threading.Event = field(default_factory=threading.Event)


class FakeProvider:
    """Subclasses give the provider's shapes: ``answer_json`` and ``stream_events``."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.behaviours: deque[Behaviour] = deque()
        self.received = threading.Event()
        self.unstall = threading.Event()
        self.usage: dict[str, Any] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def end_headers(self) -> None:
                # Each answer ends its connection (close_connection below): say so, or a client
                # pools the connection and its next request reads a closed socket.
                self.send_header("Connection", "close")
                super().end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                seen = Seen(path=self.path, body=body, headers=dict(self.headers.items()))
                fake.requests.append(seen)
                fake.received.set()
                behaviour = fake.behaviours.popleft() if fake.behaviours else Behaviour()
                try:
                    fake.answer(self, seen, behaviour)
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                    seen.client_closed.set()
                finally:
                    seen.finished.set()
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = serve_in_background(self.server)

    @property
    def base_url(self) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}"  # the address it is bound to

    def then(self, **kwargs: Any) -> FakeProvider:
        self.behaviours.append(Behaviour(**kwargs))
        return self

    def stop(self) -> None:
        self.unstall.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def last(self) -> Seen:
        assert self.requests, "the fake received no request"
        return self.requests[-1]

    # -- answering ---------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, seen: Seen, behaviour: Behaviour) -> None:
        if behaviour.kind == "status":
            self._send(handler, behaviour.status, self.error_json(behaviour.status))
            return
        if behaviour.kind == "stall":
            self.unstall.wait(WAIT)
            return
        if behaviour.kind == "drop" and not seen.body.get("stream"):
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if not seen.body.get("stream"):
            self._send(handler, 200, self.answer_json(seen, behaviour))
            self.billed(seen, cut=False)
            return
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        texts = 0
        for index, (event, data) in enumerate(self.stream_events(seen, behaviour)):
            text = self.event_text(event, data)
            if text and behaviour.cut_after_text is not None and texts >= behaviour.cut_after_text:
                self._stall(handler, seen)
                self.billed(seen, cut=True)
                return
            if behaviour.kind == "drop" and index > behaviour.chunks // 2 + 1:
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            if behaviour.delay and index:
                time.sleep(behaviour.delay)
            if behaviour.stall_after is not None and index == behaviour.stall_after:
                self._stall(handler, seen)
                return
            payload = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
            raw = payload.encode()
            handler.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            handler.wfile.flush()
            seen.chunks_sent += 1
            if text:
                texts += 1
                seen.text_sent += text
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
        self.billed(seen, cut=False)

    def _stall(self, handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        """Send nothing more until ``unstall`` (bounded), noticing if the client closes."""
        deadline = time.monotonic() + WAIT
        while not self.unstall.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([handler.connection], [], [], 0.02)
            if readable and not handler.connection.recv(1, socket.MSG_PEEK):
                seen.client_closed.set()
                return

    def _send(self, handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def error_json(self, status: int) -> dict[str, Any]:
        return {"error": {"type": "fake_error", "message": f"fake {status}"}}

    def answer_json(self, seen: Seen, behaviour: Behaviour) -> dict[str, Any]:
        raise NotImplementedError

    def stream_events(self, seen: Seen, behaviour: Behaviour) -> Iterator[tuple[str, str]]:
        raise NotImplementedError

    def event_text(self, event: str, data: str) -> str:
        """The visible text a stream event carries ("" for others)."""
        return ""

    def billed(self, seen: Seen, *, cut: bool) -> None:
        """Record what the provider bills for ``seen`` (realistic fakes); ``cut``: the client
        stopped reading after ``seen.text_sent``."""
