"""Signing of webhook deliveries, the way Stripe signs its own (docs/alerts.md, "Signatures").

The header ``LLM-Budgets-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>]`` carries the time of
signing and an HMAC-SHA256 of ``"<t>.<raw body>"`` under each secret that is valid (two during a
rotation). A receiver recomputes it with its secret, compares in constant time, and refuses a
timestamp outside its replay window. Pure: no Django, so receivers can copy it.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable

SIGNATURE_HEADER = "LLM-Budgets-Signature"
DELIVERY_HEADER = "LLM-Budgets-Delivery"
EVENT_HEADER = "LLM-Budgets-Event"
SCHEME = "v1"
# Seconds a signature stays acceptable (either side of the receiver's clock).
DEFAULT_TOLERANCE = 300


class SignatureInvalid(ValueError):
    """The payload is not signed by any of the receiver's secrets, or the signature is too old
    (a replay) or malformed. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"Signature refused: {reason}")


def signature(secret: str, timestamp: int, payload: bytes) -> str:
    signed = str(timestamp).encode() + b"." + payload
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(payload: bytes, secrets: Iterable[str], *, timestamp: int | None = None) -> str:
    """The header value for ``payload`` signed with each of ``secrets`` (at least one)."""
    t = int(time.time()) if timestamp is None else timestamp
    parts = [f"{SCHEME}={signature(secret, t, payload)}" for secret in secrets if secret]
    if not parts:
        raise ValueError("sign needs at least one secret")
    return ",".join([f"t={t}", *parts])


def verify(
    payload: bytes | str,
    header: str | None,
    secret: str | Iterable[str],
    *,
    tolerance: int = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> int:
    """Check a delivery: ``payload`` is the raw body as received, ``header`` the value of
    ``LLM-Budgets-Signature``, ``secret`` the endpoint's secret (or several, while the receiver
    rotates). Returns the signed timestamp; raises ``SignatureInvalid`` otherwise.

    An empty secret (or none) raises ``ValueError`` before anything is checked: anyone can sign
    with an empty key, so a receiver whose secret setting is unset must refuse everything, and
    loudly (it is the receiver's configuration that is wrong, not the request)."""
    if isinstance(payload, str):
        payload = payload.encode()
    secrets = [secret] if isinstance(secret, str) else list(secret)
    if not secrets or not all(isinstance(key, str) and key for key in secrets):
        raise ValueError(
            "verify needs the endpoint's signing secret (llmbsec_...): got an empty one. Is the "
            "setting that holds it unset? Nothing can be verified without it."
        )
    if not header:
        raise SignatureInvalid("no signature header")
    timestamp: int | None = None
    candidates = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureInvalid("malformed timestamp") from None
        elif key == SCHEME:
            candidates.append(value)
    if timestamp is None:
        raise SignatureInvalid("no timestamp")
    if not candidates:
        raise SignatureInvalid(f"no {SCHEME} signature")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureInvalid("timestamp outside the tolerance (a replay, or a skewed clock)")
    for key in secrets:
        expected = signature(key, timestamp, payload)
        if any(hmac.compare_digest(expected, given) for given in candidates):
            return timestamp
    raise SignatureInvalid("no signature matches the secret")
