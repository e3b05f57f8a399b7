"""How the web process serves slow clients (docs/reliability.md, "Serving shape").

:class:`BodyDeadline` reads each request's declared body before the application runs, within one
deadline for the whole body: a client that declares a body and sends it slowly, or never, is
answered ``408`` and its connection closed when the deadline passes, instead of holding a worker
thread for as long as it likes while Django waits for the bytes. ``project/gunicorn.conf.py``
wraps the application with it in every worker.
"""

from __future__ import annotations

import contextlib
import io
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_CHUNK = 64 * 1024


class BodyDeadline:
    """WSGI middleware: the body, read in full within ``seconds`` (else 408), at most
    ``max_bytes`` long (else 413), handed to ``app`` from memory."""

    def __init__(self, app: WsgiApp, *, seconds: float, max_bytes: int) -> None:
        self.app = app
        self.seconds = seconds
        self.max_bytes = max_bytes

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # the server refuses a malformed length before this runs
        if length > self.max_bytes:
            return _refuse(start_response, "413 Content Too Large", "Request body too large.")
        if length <= 0 and not chunked:
            return self.app(environ, start_response)
        try:
            body = self._read(environ, length if not chunked else None)
        except TimeoutError:
            return _refuse(
                start_response,
                "408 Request Timeout",
                f"The request body was not received within {self.seconds:g} seconds.",
            )
        if body is None:
            return _refuse(start_response, "413 Content Too Large", "Request body too large.")
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)

    def _read(self, environ: dict[str, Any], length: int | None) -> bytes | None:
        """``length`` bytes (None: until the end of a chunked body), or None past max_bytes.
        Each read waits at most what is left of the deadline (gunicorn hands the connection's
        socket in ``gunicorn.socket``); TimeoutError when it passes."""
        stream = environ["wsgi.input"]
        sock: socket.socket | None = environ.get("gunicorn.socket")
        deadline = time.monotonic() + self.seconds
        prior = sock.gettimeout() if sock is not None else None
        parts: list[bytes] = []
        read = 0
        # One read of the stream receives until it has what it asked for, each receive waiting
        # up to the socket's timeout: a body trickled a byte at a time passed the deadline by
        # far (1000 bytes, one every 2 s: 408 after 88 s). Every receive waits only what is left.
        unreader = getattr(getattr(stream, "reader", None), "unreader", None)
        raw = getattr(unreader, "sock", None)
        if raw is not None:
            unreader.sock = _DeadlineSocket(raw, deadline)
        try:
            while length is None or read < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if sock is not None:
                    sock.settimeout(left)
                want = _CHUNK if length is None else min(_CHUNK, length - read)
                data = stream.read(want)
                if not data:
                    break  # the client closed early: the application sees what came
                parts.append(data)
                read += len(data)
                if read > self.max_bytes:
                    return None
        finally:
            if raw is not None:
                unreader.sock = raw
            if sock is not None:
                with contextlib.suppress(OSError):  # closed meanwhile
                    sock.settimeout(prior)
        return b"".join(parts)


class _DeadlineSocket:
    """The connection's socket as gunicorn's body reader receives from it, each receive
    bounded by what is left of the body's deadline (TimeoutError once it has passed)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def recv(self, size: int) -> bytes:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._sock.settimeout(left)
        return self._sock.recv(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _refuse(start_response: StartResponse, status: str, message: str) -> Iterable[bytes]:
    body = message.encode()
    start_response(
        status,
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),  # what is left of the body must not be read as a request
        ],
    )
    return [body]
