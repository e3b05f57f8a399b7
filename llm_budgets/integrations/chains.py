"""Responses the guard saw answered, by id: the tokens their chain billed, so that a next turn
naming one (Responses ``previous_response_id``) is held at that chain instead of the model's
whole context window.

A response's reported ``input_tokens`` already count every earlier turn of its chain; its
``output_tokens`` are what the next turn adds as input (reasoning included, an upper bound: the
provider drops earlier reasoning). So the next turn's stored input is at most their sum.

Kept in this process only, per tenant (a tenant naming another's response id is held at the
context window, never at the other's record), the most recent ``MAX_RESPONSES``: a miss (another
worker answered the earlier turn, a restart, an evicted id) is held at the context window,
which is always enough.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

# How many responses a process remembers (a few hundred kilobytes).
MAX_RESPONSES = 10_000

_Key = tuple[str, str, str]  # (tenant, provider, response id)
_chains: OrderedDict[_Key, int] = OrderedDict()
_lock = threading.Lock()


def chain_record(*, tenant: str, provider: str, response_id: str, tokens: int) -> None:
    """Remember that ``response_id`` was billed ``tokens`` input and output tokens in all."""
    key = (tenant, provider, response_id)
    with _lock:
        _chains[key] = tokens
        _chains.move_to_end(key)
        while len(_chains) > MAX_RESPONSES:
            _chains.popitem(last=False)


def chain_tokens(*, tenant: str, provider: str, response_id: str) -> int | None:
    """The tokens recorded for ``response_id`` of ``tenant``, or None when this process has
    none."""
    with _lock:
        return _chains.get((tenant, provider, response_id))


def chains_clear() -> None:
    """Forget every record (tests)."""
    with _lock:
        _chains.clear()
