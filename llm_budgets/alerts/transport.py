"""One HTTP POST to an alert endpoint, with the guards an outbound call to a URL someone typed
needs (docs/alerts.md, "Delivery"):

- the host is resolved once and every address it resolves to must be allowed
  (``alerts.addresses``: public ones, an IPv6 address judged by the IPv4 it embeds); the
  connection goes to the address checked, so a second resolution cannot swap in another (DNS
  rebinding); the failure says only that the target is not allowed, never what it resolved to
  (the log says that, for the operators);
- https is required unless DEBUG or ``ALERTS_ALLOW_HTTP``; certificates are verified;
- one deadline for the whole attempt (connect, send, the answer), and at most
  ``ALERTS_MAX_RESPONSE_BYTES`` of the answer read;
- no redirect is followed: a 3xx is a failed attempt that names where it pointed.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from llm_budgets.alerts.addresses import NOT_ALLOWED, address_allowed, refused, resolved
from llm_budgets.alerts.endpoints import http_allowed
from llm_budgets.conf import conf

logger = logging.getLogger("llm_budgets")

__all__ = ["AddressRefused", "Answer", "DeliveryFailed", "address_allowed", "post"]

USER_AGENT = "llm-budgets-alerts/1"


class DeliveryFailed(Exception):
    """An attempt that did not get a 2xx. ``status``: the answer's status code, if one came;
    ``retry_after``: seconds the endpoint asked us to wait (429, 503)."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


class AddressRefused(DeliveryFailed):
    """The endpoint's host resolves to an address alerts may not call (SSRF guard)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def _resolve(host: str, port: int, deadline: float) -> tuple[int, str]:
    try:
        addresses = resolved(host, port)
    except OSError as exc:
        raise DeliveryFailed(f"cannot resolve {host}: {exc}") from exc
    if time.monotonic() > deadline:
        raise DeliveryFailed(f"resolving {host} took longer than the timeout")
    bad = refused(addresses)
    if bad or not addresses:
        # Who reads the delivery (a tenant) learns only that it is refused: what an internal
        # name resolves to stays in the operators' log.
        logger.warning(
            "llm_budgets: alert endpoint host %s refused: it resolves to %s",
            host,
            ", ".join(bad) or "nothing",
        )
        raise AddressRefused(f"{host}: {NOT_ALLOWED}")
    return addresses[0]


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeliveryFailed("timed out")
    return left


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to ``url``; the answer if it is a 2xx, else ``DeliveryFailed``."""
    timeout = float(conf.ALERTS_TIMEOUT_SECONDS)
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise DeliveryFailed(f"not an http(s) URL: {url!r}")
    if parts.scheme == "http" and not http_allowed():
        raise DeliveryFailed("plain http is refused outside DEBUG (ALERTS_ALLOW_HTTP)")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    _family, address = _resolve(host, port, deadline)
    try:
        sock: socket.socket = socket.create_connection((address, port), _remaining(deadline))
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    except DeliveryFailed:
        raise
    except OSError as exc:
        raise DeliveryFailed(f"cannot connect to {host}:{port}: {exc}") from exc
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    connection.sock = sock  # the address checked above, never a second resolution
    try:
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        sock.settimeout(_remaining(deadline))
        connection.request(
            "POST",
            path,
            body=body,
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json", **headers},
        )
        sock.settimeout(_remaining(deadline))
        response = connection.getresponse()
        cap = conf.ALERTS_MAX_RESPONSE_BYTES
        answer = b""
        # A response that has read its whole body closes the socket (Python 3.13 closes the
        # descriptor then): stop there rather than set a timeout on a closed socket.
        while len(answer) <= cap and not response.isclosed():
            sock.settimeout(_remaining(deadline))
            chunk = response.read1(min(65536, cap + 1 - len(answer)))
            if not chunk:
                break
            answer += chunk
        answer = answer[:cap]  # the rest is never read
    except DeliveryFailed:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    finally:
        connection.close()
    status = response.status
    if 200 <= status < 300:
        return Answer(status, answer)
    if 300 <= status < 400:
        raise DeliveryFailed(
            f"HTTP {status}: redirect to {response.getheader('Location')!r} not followed",
            status=status,
        )
    raise DeliveryFailed(
        f"HTTP {status}: {answer[:200].decode(errors='replace')}".strip(),
        status=status,
        retry_after=retry_after_seconds(response.getheader("Retry-After")),
    )
