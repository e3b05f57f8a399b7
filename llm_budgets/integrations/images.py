"""Images whose tokens can be counted offline, by the providers' published rules, on the pixel size
read from the image's own header (PNG, GIF, JPEG, WebP) for images sent inline.

Anthropic: an image costs about ``width * height / 750`` tokens, after it is scaled down to fit
the model's limits (never up): the rule on the size as sent is an upper bound. An image by URL
has no size until it is fetched, and so cannot be counted.

OpenAI (its vision guide, "Calculating costs"): tile models bill ``base`` tokens at
``detail: "low"``, and at "high"/"auto" ``base + tile * tiles``, the tiles being the 512 px
squares of the image after it is scaled to fit 2048x2048 and then its short side to 768. Patch
models bill the 32 px patches (at most 1536) times a multiplier, whatever the detail. An image by
URL is never fetched: it is held at the most any size can cost (``OPENAI_MAX_TILES`` tiles, or
every patch), so it always fits its hold.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass

ANTHROPIC_PIXELS_PER_TOKEN = 750
# JPEG start-of-frame markers (they carry the size): SOF0-SOF15 but DHT, JPG and DAC.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG, GIF, JPEG or WebP header; None if not one of those."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in {b"GIF87a", b"GIF89a"} and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return width, height
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def anthropic_image_tokens(block: object) -> int | None:
    """The tokens of an Anthropic ``image`` block sent inline (base64), by the published rule;
    None when it cannot be counted offline (by URL or file id, or not an image it can read)."""
    source = block.get("source") if isinstance(block, dict) else None
    if not isinstance(source, dict) or source.get("type") != "base64":
        return None
    try:
        data = base64.b64decode(str(source.get("data", "")), validate=True)
    except (binascii.Error, ValueError):
        return None
    size = image_size(data)
    if size is None or 0 in size:
        return None
    return math.ceil(size[0] * size[1] / ANTHROPIC_PIXELS_PER_TOKEN)


# -- OpenAI --------------------------------------------------------------------------------------

# The most 512 px tiles an image can have after OpenAI's scaling (fit 2048x2048, short side 768):
# 768 x 2048 is 2 x 4 tiles.
OPENAI_MAX_TILES = 8
OPENAI_MAX_PATCHES = 1536
_TILE = 512
_PATCH = 32
# Enough of a data URL's base64 to read any of the headers ``image_size`` reads (a JPEG's frame
# marker may follow some kilobytes of metadata): never the whole image.
_HEADER_BASE64_CHARS = 64 * 1024


@dataclass(frozen=True)
class OpenAIImageRule:
    """How a model family bills an image: tiles (``base``, ``tile``) or patches (``patches``,
    the multiplier, with ``base`` and ``tile`` 0)."""

    base: int = 0
    tile: int = 0
    patches: float = 0.0


# By model name prefix, the first that matches (longer names first). From OpenAI's vision guide;
# a name none matches is held at the dearest rule (``OPENAI_UNKNOWN_IMAGE_RULE``).
OPENAI_IMAGE_RULES: tuple[tuple[str, OpenAIImageRule], ...] = (
    ("gpt-4o-mini", OpenAIImageRule(base=2833, tile=5667)),
    ("gpt-4.1-mini", OpenAIImageRule(patches=1.62)),
    ("gpt-4.1-nano", OpenAIImageRule(patches=2.46)),
    ("gpt-5-mini", OpenAIImageRule(patches=1.62)),
    ("gpt-5-nano", OpenAIImageRule(patches=2.46)),
    ("o4-mini", OpenAIImageRule(patches=1.72)),
    ("gpt-5", OpenAIImageRule(base=70, tile=140)),
    ("gpt-4o", OpenAIImageRule(base=85, tile=170)),
    ("chatgpt-4o", OpenAIImageRule(base=85, tile=170)),
    ("gpt-4.1", OpenAIImageRule(base=85, tile=170)),
    ("gpt-4.5", OpenAIImageRule(base=85, tile=170)),
    ("gpt-4-turbo", OpenAIImageRule(base=85, tile=170)),
    ("o1", OpenAIImageRule(base=75, tile=150)),
    ("o3", OpenAIImageRule(base=75, tile=150)),
    ("computer-use", OpenAIImageRule(base=65, tile=129)),
)
OPENAI_UNKNOWN_IMAGE_RULE = OpenAIImageRule(base=2833, tile=5667)


def openai_image_rule(model: str) -> OpenAIImageRule:
    name = model.rsplit("/", 1)[-1]
    for prefix, rule in OPENAI_IMAGE_RULES:
        if name.startswith(prefix):
            return rule
    return OPENAI_UNKNOWN_IMAGE_RULE


def _openai_tiles(width: int, height: int) -> int:
    """The 512 px tiles of an image after OpenAI's scaling; scaled up to a 768 px short side as
    well as down, whichever gives more (the guide does not say whether small images grow)."""
    scale = min(1.0, 2048 / max(width, height))
    fitted = (width * scale, height * scale)
    shortest = 768 / min(fitted)
    most = 0
    for factor in {1.0, shortest} if shortest > 1 else {shortest}:
        tiles = math.ceil(fitted[0] * factor / _TILE) * math.ceil(fitted[1] * factor / _TILE)
        most = max(most, tiles)
    return min(most, OPENAI_MAX_TILES)


def openai_image_tokens(*, model: str, detail: object, size: tuple[int, int] | None) -> int:
    """The most an image of ``size`` (None: unknown, by URL) can bill on ``model``."""
    rule = openai_image_rule(model)
    if rule.patches:
        patches = OPENAI_MAX_PATCHES
        if size is not None:
            patches = min(patches, math.ceil(size[0] / _PATCH) * math.ceil(size[1] / _PATCH))
        return math.ceil(patches * rule.patches)
    if detail == "low":
        return rule.base
    tiles = OPENAI_MAX_TILES if size is None else _openai_tiles(*size)
    return rule.base + rule.tile * tiles


def data_url_size(url: object) -> tuple[int, int] | None:
    """The pixel size of an image sent as a ``data:`` URL (base64), read from its header only;
    None for a remote URL or an image it cannot read."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    head, _, data = url.partition(",")
    if not head.endswith(";base64"):
        return None
    prefix = data[:_HEADER_BASE64_CHARS]
    prefix = prefix[: len(prefix) - len(prefix) % 4]
    try:
        decoded = base64.b64decode(prefix, validate=True)
    except (binascii.Error, ValueError):
        return None
    size = image_size(decoded)
    return None if size is None or 0 in size else size
