"""``Idempotency-Key`` on every POST: a retry gets the first response, never a second effect.

Race-safe by inserting first: the record is created *before* the request runs, and the unique
constraint on (API key, key) lets exactly one request through. A concurrent duplicate sees the
record without a response and gets ``409 idempotency_in_progress`` (retry shortly); a later
duplicate gets the stored response with ``Idempotent-Replayed: true``; the same key with another
method, path or body is ``409 idempotency_key_reused``. Only 2xx responses are stored: a failed
request changed nothing, so its retry runs again (a refused reservation may fit after a reset).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from llm_budgets.api.exceptions import HttpError
from llm_budgets.engine.boundary import ledger_guard
from llm_budgets.models import ApiKey, IdempotencyRecord
from llm_budgets.validation import storable

HEADER = "Idempotency-Key"
FIELD = "idempotency_key"
REPLAYED_HEADER = "Idempotent-Replayed"
# A record still without a response after this long belongs to a request that died: reclaim it.
LEASE = timedelta(seconds=60)

View = TypeVar("View")
Handler = Callable[..., Response]


def key_of(request: Request) -> str | None:
    """The key from the header, else from the body field; both must agree when both are sent."""
    header = request.headers.get(HEADER)
    body = request.data.get(FIELD) if isinstance(request.data, dict) else None
    if header is not None and body is not None and header != body:
        raise HttpError(
            f"The {HEADER} header ({header!r}) and the {FIELD} field ({body!r}) differ; "
            "send one key.",
            code="invalid",
            status_code=status.HTTP_400_BAD_REQUEST,
        )
    key = header if header is not None else body
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip() or len(key) > 255 or not storable(key):
        raise HttpError(
            f"{HEADER} must be a non-empty string of at most 255 characters, without NUL.",
            code="invalid",
            status_code=status.HTTP_400_BAD_REQUEST,
        )
    return key


def _fingerprint(request: Request) -> str:
    body = json.dumps(request.data, cls=JSONEncoder, sort_keys=True, separators=(",", ":"))
    text = f"{request.method} {request.path}\n{body}"
    return hashlib.sha256(text.encode()).hexdigest()


def _claim(api_key: ApiKey, key: str, request: Request, digest: str) -> IdempotencyRecord | None:
    """Insert the record; None if this request now owns the key, else the existing record."""
    for _attempt in range(2):
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    api_key=api_key,
                    key=key,
                    method=request.method or "",
                    path=request.path.encode("unicode_escape").decode("ascii")[:512],
                    request_hash=digest,
                    created_at=timezone.now(),
                )
            return None
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(api_key=api_key, key=key).first()
            if existing is None:
                continue  # its owner failed and deleted it meanwhile: try again
            if existing.status_code is None and existing.created_at < timezone.now() - LEASE:
                # Compare-and-delete, so only one reclaimer wins.
                IdempotencyRecord.objects.filter(
                    pk=existing.pk, status_code__isnull=True, created_at=existing.created_at
                ).delete()
                continue
            return existing
    raise HttpError(
        f"Another request with {HEADER} {key!r} is in progress; retry shortly.",
        code="idempotency_in_progress",
        status_code=status.HTTP_409_CONFLICT,
        retry_after=1,
    )


def _replay(record: IdempotencyRecord, key: str, digest: str) -> Response:
    if record.request_hash != digest:
        raise HttpError(
            f"{HEADER} {key!r} was already used for a different request "
            f"({record.method} {record.path} with another body); use a new key for a new "
            "request.",
            code="idempotency_key_reused",
            status_code=status.HTTP_409_CONFLICT,
        )
    if record.status_code is None:
        raise HttpError(
            f"The first request with {HEADER} {key!r} is still running; retry shortly.",
            code="idempotency_in_progress",
            status_code=status.HTTP_409_CONFLICT,
            retry_after=1,
        )
    return Response(
        record.response_body, status=record.status_code, headers={REPLAYED_HEADER: "true"}
    )


def idempotent(handler: Handler) -> Handler:
    """Decorate a view's ``post``: run it at most once per (API key, Idempotency-Key)."""

    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = key_of(request)
        if key is None or not isinstance(request.auth, ApiKey):
            return handler(view, request, *args, **kwargs)
        digest = _fingerprint(request)
        with ledger_guard("idempotency"):
            existing = _claim(request.auth, key, request, digest)
        if existing is not None:
            return _replay(existing, key, digest)
        owned = IdempotencyRecord.objects.filter(api_key=request.auth, key=key)
        try:
            response = handler(view, request, *args, **kwargs)
        except BaseException:
            with contextlib.suppress(DatabaseError):  # never hide the real error behind this one
                owned.delete()
            raise
        if status.is_success(response.status_code):
            owned.update(
                status_code=response.status_code,
                response_body=json.loads(json.dumps(response.data, cls=JSONEncoder)),
            )
        else:
            owned.delete()
        return response

    return wrapper


def idempotency_records_clear(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete records older than ``older_than`` (like Django's ``clearsessions``): after that a
    retry with the same key runs again. Reservations stay protected by their own idempotency key.
    Returns how many were deleted."""
    cutoff = (now or timezone.now()) - older_than
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
