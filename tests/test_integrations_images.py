"""Image sizes read from headers, for Anthropic's published image token rule."""

from __future__ import annotations

import base64
import struct

from llm_budgets.integrations.images import anthropic_image_tokens, image_size


def test_sizes_from_png_gif_jpeg_and_webp_headers() -> None:
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 640, 480)
    gif = b"GIF89a" + struct.pack("<HH", 32, 16)
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 1080, 1920) + b"\x00" * 10
    jpeg = b"\xff\xd8" + app0 + sof
    webp = b"RIFF" + b"\x00" * 4 + b"WEBPVP8X" + b"\x00" * 8 + (99).to_bytes(3, "little")
    webp += (49).to_bytes(3, "little")
    assert image_size(png) == (640, 480)
    assert image_size(gif) == (32, 16)
    assert image_size(jpeg) == (1920, 1080)
    assert image_size(webp) == (100, 50)
    assert image_size(b"%PDF-1.7") is None


def test_only_inline_images_are_counted() -> None:
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 1000, 750)
    inline = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    assert anthropic_image_tokens({"type": "image", "source": inline}) == 1000
    by_url = {"type": "url", "url": "https://example.com/x.png"}
    assert anthropic_image_tokens({"type": "image", "source": by_url}) is None
    broken = {"type": "base64", "media_type": "image/png", "data": "not base64!"}
    assert anthropic_image_tokens({"type": "image", "source": broken}) is None
