"""A TCP fault proxy of our own, on 127.0.0.1, between a client (the app) and a server
(PostgreSQL, Redis, a fake HTTP server), driven from tests: this project's fault tests and
benches, and a host's own (it imports only the standard library).

Faults, each applied to the connections open now and to new ones until ``heal()``:

- ``latency_set(seconds)``: every chunk in either direction is delayed by ``seconds`` (a
  request and its answer, one chunk each way: ``2 * seconds`` per round trip);
- ``stall()``: nothing is forwarded (bytes wait in the kernel buffers) until healed;
- ``blackhole()``: bytes from either side are read and thrown away; new connections are accepted
  and never reach the server (a partition in which the peer's kernel still answers);
- ``reset()``: every open connection is closed with a TCP RST (both sides);
- ``drop()``: every open connection is closed cleanly (FIN), as when a server process dies;
- ``refuse()``: new connections are accepted and closed at once (the server is down).

One-shot triggers on the bytes a client sends, for faults at an exact point of a protocol:

- ``cut_when_client_sends(pattern, before=True, nth=1)``: the nth chunk containing ``pattern``
  (``b""``: the nth chunk of any kind, i.e. every statement boundary in turn) is never
  forwarded and the connection is reset (lost *before* the server saw it, e.g. ``b"COMMIT"``);
- ``cut_when_client_sends(pattern, before=False)``: the chunk is forwarded, the server's answer
  is thrown away and the connection is reset (lost *after* the server acted on it);
- ``cut_when_client_sends(pattern, before=..., outage=True)``: the server goes down at that
  chunk (before it or right after it is forwarded): every open connection is reset and new ones
  are refused until ``heal()``, in the proxy's own thread, before the client can use another.

``counts`` records how many times each fault was applied, for docs/reliability.md.

``FaultProxy(..., delay_line=True)`` makes the proxy a network link instead (bench/admission.py's
``--rtt-ms``): ``latency`` is a propagation delay, each chunk forwarded ``latency`` seconds after
it arrived while the chunks behind it are read meanwhile (chunks in flight overlap, as pipelined
statements do on a network), and both sockets have ``TCP_NODELAY``, as the client's and the
server's own have (without it, back-to-back small chunks wait for an ACK). The default keeps the
behaviour the fault tests were written against: each chunk sleeps ``latency`` in turn, so chunks
queued behind one another add their delays up. Either way a round trip (one chunk each way)
gains ``2 * latency``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

PASS, STALL, BLACKHOLE, REFUSE = "pass", "stall", "blackhole", "refuse"


@dataclass
class _Trigger:
    pattern: bytes
    before: bool
    nth: int = 1  # fire on the nth chunk containing pattern (b"" matches every chunk)
    outage: bool = False  # the cut also resets every connection and refuses new ones
    stall: bool = False  # instead of cutting: hold the chunk and everything after it
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)


class _Pair:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.closed = threading.Event()
        self.discard_server = False  # after a post-send trigger: the answer never arrives
        self.stalled = False

    def start(self) -> None:
        pump = self._pump
        if self.proxy.delay_line:
            pump = self._pump_delayed
            for sock in (self.client, self.server):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for src, dst, upstream in (
            (self.client, self.server, True),
            (self.server, self.client, False),
        ):
            threading.Thread(target=pump, args=(src, dst, upstream), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while not self.closed.is_set():
                if self.proxy.mode == STALL:
                    time.sleep(0.01)
                    continue
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready:
                    continue
                chunk = src.recv(65536)
                if not chunk:
                    self.close(rst=False)
                    return
                if self.proxy.mode == BLACKHOLE:
                    continue
                if upstream and self._trigger(chunk, dst):
                    return
                if not upstream and self.discard_server:
                    self.close(rst=True)
                    return
                if self.proxy.latency:
                    time.sleep(self.proxy.latency)
                dst.sendall(chunk)
        except OSError:
            self.close(rst=False)

    def _pump_delayed(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        """``delay_line``: each chunk leaves ``latency`` after it was read, and reading goes on
        while chunks wait, so a chunk never waits for the delay of the one before it."""
        pending: deque[tuple[float, bytes]] = deque()  # (when to forward, chunk), in order
        # A timer wakes the thread late (tens of microseconds, more on a VM or under load): aim
        # that much early, its running mean, so that chunks leave on time on average. Capped at
        # half the delay, so that every chunk still waits on a timer (which keeps the mean fed).
        early = 0.0
        try:
            while not self.closed.is_set():
                if self.proxy.mode == STALL:
                    time.sleep(0.01)
                    continue
                now = time.monotonic()
                while pending and pending[0][0] - early <= now:
                    dst.sendall(pending.popleft()[1])
                    now = time.monotonic()
                aim = pending[0][0] - early if pending else now + 0.05
                ready, _, _ = select.select([src], [], [], min(aim - now, 0.05))
                if not ready:
                    if pending and aim - now < 0.05:  # a timed wake-up: how late was it?
                        cap = self.proxy.latency / 2
                        late = min(max(time.monotonic() - aim, 0.0), cap)
                        early = min(early + (late - early) / 8, cap)
                    continue
                chunk = src.recv(65536)
                if not chunk:
                    for due, held in pending:  # what was in flight still arrives, then the FIN
                        time.sleep(max(0.0, due - time.monotonic()))
                        dst.sendall(held)
                    self.close(rst=False)
                    return
                if self.proxy.mode == BLACKHOLE:
                    continue
                if upstream and self._trigger(chunk, dst):
                    return
                if not upstream and self.discard_server:
                    self.close(rst=True)
                    return
                if not pending and not self.proxy.latency:
                    dst.sendall(chunk)
                else:
                    pending.append((time.monotonic() + self.proxy.latency, chunk))
        except (OSError, ValueError):  # ValueError: select() on a socket closed meanwhile (fd -1)
            self.close(rst=False)

    def _trigger(self, chunk: bytes, dst: socket.socket) -> bool:
        """Apply a one-shot trigger matching ``chunk``; True when the connection is gone."""
        with self.proxy.lock:
            trigger = None
            for candidate in self.proxy.triggers:
                if candidate.pattern in chunk:
                    candidate.seen += 1
                    if candidate.seen == candidate.nth:
                        trigger = candidate
                        break
            if trigger is not None:
                self.proxy.triggers.remove(trigger)
        if trigger is None:
            return False
        if trigger.stall:
            self.proxy.count("stall at message")
            trigger.fired.set()
            self.stalled = True
            # What the client sends meanwhile (a pipelined Sync, the next statement) is held
            # too, in order; reading it (not peeking) is what lets its end be seen behind it.
            held = [chunk]
            while self.stalled and not self.closed.is_set():
                ready, _, _ = select.select([self.client], [], [], 0.05)
                if ready:
                    more = self.client.recv(65536)
                    if not more:
                        self.close(rst=False)  # the client died: PostgreSQL sees it go
                        return True
                    held.append(more)
            if self.closed.is_set():
                return True
            dst.sendall(b"".join(held))
            return False
        self.proxy.count("cut before" if trigger.before else "cut after")
        trigger.fired.set()  # first: the client may see the failure as soon as the cut happens
        if trigger.outage:
            if not trigger.before:
                dst.sendall(chunk)
            self.proxy.refuse()
            self.proxy.reset()  # this connection included
            return True
        if trigger.before:
            self.close(rst=True)
            return True
        self.discard_server = True
        dst.sendall(chunk)
        return False

    def close(self, *, rst: bool) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                if rst:  # SO_LINGER 0: close() sends RST instead of FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
        with self.proxy.lock:
            if self in self.proxy.pairs:
                self.proxy.pairs.remove(self)


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, delay_line: bool = False) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_line = delay_line  # latency as a link's propagation delay (module docstring)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.mode = PASS
        self.latency = 0.0
        self.lock = threading.Lock()
        self.pairs: list[_Pair] = []
        self.triggers: list[_Trigger] = []
        self.counts: Counter[str] = Counter()
        self.connections = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, fault: str) -> None:
        with self.lock:
            self.counts[fault] += 1

    def _accept(self) -> None:
        while not self._stopping.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.05)
            if not ready:
                continue
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.mode == REFUSE:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            if self.mode == BLACKHOLE:
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = _Pair(self, client, server)
            with self.lock:
                self.pairs.append(pair)
            pair.start()

    def _swallow(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            while not self._stopping.is_set() and self.mode == BLACKHOLE:
                ready, _, _ = select.select([client], [], [], 0.05)
                if ready and not client.recv(65536):
                    return

    # -- faults --------------------------------------------------------------------------------

    def _all_pairs(self) -> list[_Pair]:
        with self.lock:
            return list(self.pairs)

    def latency_set(self, seconds: float) -> None:
        """Delay every chunk in each direction by ``seconds``: a round trip gains twice that."""
        self.latency = seconds
        self.count("latency")

    def stall(self) -> None:
        self.mode = STALL
        self.count("stall")

    def blackhole(self) -> None:
        self.mode = BLACKHOLE
        self.count("blackhole")

    def refuse(self) -> None:
        self.mode = REFUSE
        self.count("refuse")

    def reset(self) -> None:
        for pair in self._all_pairs():
            pair.close(rst=True)
        self.count("reset")

    def drop(self) -> None:
        for pair in self._all_pairs():
            pair.close(rst=False)
        self.count("drop")

    def cut_when_client_sends(
        self, pattern: bytes, *, before: bool, nth: int = 1, outage: bool = False
    ) -> threading.Event:
        """Cut at the ``nth`` client chunk containing ``pattern``; the event is set once cut.
        ``outage``: the server goes down there (every connection reset, new ones refused)."""
        trigger = _Trigger(pattern, before, nth, outage=outage)
        with self.lock:
            self.triggers.append(trigger)
        return trigger.fired

    def stall_when_client_sends(self, pattern: bytes, *, nth: int = 1) -> threading.Event:
        """Hold the ``nth`` client chunk containing ``pattern`` (and its connection) until
        ``heal()`` or until the client goes away; the event is set once it is held."""
        trigger = _Trigger(pattern, before=True, nth=nth, stall=True)
        with self.lock:
            self.triggers.append(trigger)
        return trigger.fired

    def heal(self) -> None:
        for pair in self._all_pairs():
            pair.stalled = False
        self.mode = PASS
        self.latency = 0.0
        with self.lock:
            self.triggers.clear()

    def close(self) -> None:
        self._stopping.set()
        for pair in self._all_pairs():
            pair.close(rst=False)
        with contextlib.suppress(OSError):
            self.listener.close()
        self._thread.join(5)
