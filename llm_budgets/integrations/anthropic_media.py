"""Images and documents in an Anthropic request, at the most Anthropic can bill for them, so a
call that carries them is held instead of refused.

- An image is scaled down (never up) to fit the model's limits before it is counted: at most
  :data:`IMAGE_MAX_TOKENS` on any current model (Opus 4.7 and later read up to 2,576 px on the
  long edge, ``ceil(w/28) * ceil(h/28)`` <= 4,784 tokens; earlier models about 1,600). An image
  sent inline is counted from its own header by the published rules, the larger of
  ``w * h / 750`` (:func:`llm_budgets.integrations.images.anthropic_image_tokens`) and the newer
  models' 28 px patches (more for a small image); one by URL or file id is never fetched, and is
  held at that maximum.
- A plain-text document (``source.type`` "text", or "content" with text and image parts) is its
  text (and images).
- A PDF sent inline (base64) is counted by its pages: each page is billed as its extracted text
  plus an image of the page. Anthropic publishes 1,500-3,000 text tokens a page for typical
  pages; the guard holds :data:`PDF_TEXT_TOKENS_PER_PAGE` plus :data:`IMAGE_MAX_TOKENS` a page.
  A denser page is billed past the hold (the provider's count is what is charged).
- A PDF by URL or file id has no page count until it is fetched: refused, saying how to send it.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import zlib
from typing import Any

from llm_budgets.exceptions import InvalidUsage
from llm_budgets.integrations.images import anthropic_image_tokens, image_size

IMAGE_MAX_TOKENS = 4_784
PATCH_PIXELS = 28
PDF_TEXT_TOKENS_PER_PAGE = 3_000
PDF_PAGE_TOKENS = PDF_TEXT_TOKENS_PER_PAGE + IMAGE_MAX_TOKENS

# A page object (not the /Pages tree nodes), a /Pages node's /Count, and the compressed object
# streams (PDF 1.5) that may hide page objects from a plain scan.
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PAGES_NODE = re.compile(rb"<<(?:(?!<<|>>).)*?/Type\s*/Pages(?![A-Za-z])(?:(?!<<|>>).)*?>>", re.S)
_COUNT = re.compile(rb"/Count\s+(\d+)")
_OBJECT_STREAM = re.compile(rb"/Type\s*/ObjStm\b")
_STREAM = re.compile(rb"stream\r?\n")


def split_media(content: object) -> tuple[object, int]:
    """``content`` with its images and documents taken out (a text document left as a text
    part) and the tokens they are held at; tool results are searched too. ``InvalidUsage`` for a
    document that cannot be bounded before the call."""
    if not isinstance(content, list | tuple):
        return content, 0
    kept: list[object] = []
    tokens = 0
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image":
            tokens += image_tokens(block)
            continue
        if kind == "document":
            text, counted = document_tokens(block)
            tokens += counted
            if text:
                kept.append({"type": "text", "text": text})
            continue
        if kind == "tool_result":
            inner, inner_tokens = split_media(block.get("content"))
            block = {**block, "content": inner}
            tokens += inner_tokens
        kept.append(block)
    return kept, tokens


def image_tokens(block: dict[str, Any]) -> int:
    """An image's tokens by the published rule when it is inline and readable, else the most
    any image costs (by URL or file id it is never fetched)."""
    counted = anthropic_image_tokens(block)
    if counted is None:
        return IMAGE_MAX_TOKENS
    # Readable, so inline base64 with a size (anthropic_image_tokens checked both).
    width, height = image_size(base64.b64decode(block["source"]["data"]))  # type: ignore[misc]
    return max(counted, math.ceil(width / PATCH_PIXELS) * math.ceil(height / PATCH_PIXELS))


def document_tokens(block: dict[str, Any]) -> tuple[str, int]:
    """A document block as ``(text to count, tokens held besides that text)``."""
    source: dict[str, Any] = block.get("source") or {}
    kind = source.get("type") if isinstance(source, dict) else None
    labels = [str(block[name]) for name in ("title", "context") if block.get(name)]
    if kind == "text":
        return "\n".join([*labels, str(source.get("data", ""))]), 0
    if kind == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            return "\n".join([*labels, inner]), 0
        kept, tokens = split_media(inner)
        parts = kept if isinstance(kept, list) else []
        texts = [
            str(part.get("text", ""))
            for part in parts
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        if len(texts) != len(parts):
            raise InvalidUsage(
                "a document's content may hold only text and image parts.", field="messages"
            )
        return "\n".join([*labels, *texts]), tokens
    if kind == "base64" and source.get("media_type") == "application/pdf":
        return "\n".join(labels), pdf_pages(source) * PDF_PAGE_TOKENS
    raise InvalidUsage(
        f"a document by {kind!r} source cannot be priced before the call: its pages are not "
        "known until Anthropic fetches it. Send the PDF inline (source type 'base64': the guard "
        "counts its pages) or its text as a text document (source type 'text').",
        field="messages",
    )


def pdf_pages(source: dict[str, Any]) -> int:
    """The pages of an inline PDF: its page objects (compressed object streams included) or its
    page tree's ``/Count``, whichever is larger. ``InvalidUsage`` when none can be found."""
    try:
        data = base64.b64decode(str(source.get("data", "")), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    pages = 0
    if data.startswith(b"%PDF"):
        pages = len(_PAGE.findall(data)) + sum(
            len(_PAGE.findall(stream)) for stream in _object_streams(data)
        )
        for node in _PAGES_NODE.findall(data):
            pages = max(pages, *(int(count) for count in _COUNT.findall(node)), 0)
    if pages < 1:
        raise InvalidUsage(
            "a PDF document whose pages the guard cannot count (not a readable PDF): it cannot "
            "be priced before the call. Send its text as a text document instead.",
            field="messages",
        )
    return pages


def _object_streams(data: bytes) -> list[bytes]:
    """The inflated contents of the PDF's object streams (where PDF 1.5 may keep its pages)."""
    found = []
    for marker in _OBJECT_STREAM.finditer(data):
        start = _STREAM.search(data, marker.end())
        if start is None:
            continue
        end = data.find(b"endstream", start.end())
        try:
            found.append(zlib.decompressobj().decompress(data[start.end() : end]))
        except zlib.error:
            continue
    return found
