"""Images whose tokens can be counted offline: Anthropic's published rule, on the pixel size read
from the image's own header (PNG, GIF, JPEG, WebP), for images sent inline (base64). An image
by URL has no size until it is fetched, and so cannot be counted.

Anthropic: an image costs about ``width * height / 750`` tokens, after it is scaled down to fit
the model's limits (never up): the rule on the size as sent is an upper bound.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct

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
