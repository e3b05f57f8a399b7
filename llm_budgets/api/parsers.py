"""The API's one body parser: JSON, bounded before it is parsed.

Refuses, each with the API's JSON error shape and a code saying what to change:

- a body larger than Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413 ``request_too_large``), read
  no further than the limit, with or without a ``Content-Length``;
- a body that is not UTF-8 (400 ``invalid_encoding``);
- JSON nested deeper than :data:`MAX_DEPTH` (400 ``too_deeply_nested``): Python's parser would
  otherwise recurse out of stack and answer 500;
- NUL characters and unpaired surrogates anywhere in a string or a key (400 ``invalid``, naming
  the field): no database can store them as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer

from llm_budgets.api.exceptions import HttpError
from llm_budgets.validation import first_unstorable, json_depth_exceeds

# Far deeper than any request of this API (messages with content parts are about 5 deep).
MAX_DEPTH = 64
# Used when the host sets DATA_UPLOAD_MAX_MEMORY_SIZE = None (no Django limit): prompts and
# messages are the largest thing a request carries.
FALLBACK_MAX_BYTES = 10 * 1024 * 1024


def max_body_bytes() -> int:
    limit = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None)
    return FALLBACK_MAX_BYTES if limit is None else int(limit)


def too_large(limit: int) -> HttpError:
    return HttpError(
        f"The request body is larger than {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); send "
        "less: count long prompts with input_tokens instead of sending them.",
        code="request_too_large",
        status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    )


class BoundedJSONParser(BaseParser):
    """Not a subclass of DRF's ``JSONParser``: DRF reads a JSONParser's whole body through
    ``request.body`` first, where Django's own size check answers with an HTML 400."""

    media_type = "application/json"
    renderer_class = JSONRenderer

    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        if stream is None:
            return {}
        limit = max_body_bytes()
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and str(declared).isdigit() and int(declared) > limit:
            raise too_large(limit)
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise too_large(limit)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HttpError(
                f"The request body is not valid UTF-8 (byte {exc.start}); send JSON encoded "
                "as UTF-8.",
                code="invalid_encoding",
                status_code=status.HTTP_400_BAD_REQUEST,
            ) from None
        if json_depth_exceeds(text, MAX_DEPTH):
            raise HttpError(
                f"The JSON body is nested more than {MAX_DEPTH} levels deep; no request of this "
                "API needs that.",
                code="too_deeply_nested",
                status_code=status.HTTP_400_BAD_REQUEST,
            )
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        bad = first_unstorable(data)
        if bad is not None:
            raise ValidationError(
                {
                    bad: [
                        "Contains a NUL character or an unpaired surrogate, which cannot be stored."
                    ]
                }
            )
        return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
