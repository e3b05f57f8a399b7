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
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from llm_budgets import validation
from llm_budgets.api.exceptions import HttpError
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.exceptions import InvalidUsage
from llm_budgets.models import ApiKey, IdempotencyRecord

logger = logging.getLogger("llm_budgets")

HEADER = "Idempotency-Key"
FIELD = "idempotency_key"
REPLAYED_HEADER = "Idempotent-Replayed"
# A record still without a response after this long belongs to a request that died: reclaim it.
LEASE = timedelta(seconds=60)

View = TypeVar("View")
Handler = Callable[..., Response]


def _invalid(message: str) -> HttpError:
    return HttpError(message, code="invalid", status_code=status.HTTP_400_BAD_REQUEST)


def header_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` header as the client wrote it. WSGI hands headers over decoded as
    Latin-1, so UTF-8 is decoded back (not stored as mojibake); bytes that are not UTF-8 and a
    comma (two headers, which servers join with one) are refused."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    try:
        text = value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise _invalid(f"The {HEADER} header is not valid UTF-8; send ASCII.") from None
    if "," in text:
        raise _invalid(
            f"Send one {HEADER} header with one key, without commas (got {text!r}: two headers "
            "arrive joined by a comma)."
        )
    return text


def key_of(request: Request) -> str | None:
    """The key from the header, else from the body field; both must agree when both are sent.
    Canonical (``validation.identifier``), as admission stores it."""
    header = _canonical(header_key(request), f"The {HEADER} header")
    body = request.data.get(FIELD) if isinstance(request.data, dict) else None
    body = _canonical(body, f"The {FIELD} field")
    if header is not None and body is not None and header != body:
        raise _invalid(
            f"The {HEADER} header ({header!r}) and the {FIELD} field ({body!r}) differ; "
            "send one key."
        )
    return header if header is not None else body


def _canonical(key: object, where: str) -> str | None:
    if key is None:
        return None
    try:
        return validation.identifier(FIELD, key)
    except InvalidUsage as exc:
        raise _invalid(f"{where}: {exc.message}") from None


def _fingerprint(request: Request) -> str:
    # The key itself is left out: it matched already, in its canonical form (an NFD spelling of
    # the same key in the body is the same request).
    data = request.data
    if isinstance(data, dict) and FIELD in data:
        data = {name: value for name, value in data.items() if name != FIELD}
    body = json.dumps(data, cls=JSONEncoder, sort_keys=True, separators=(",", ":"))
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
        try:
            if status.is_success(response.status_code):
                owned.update(
                    status_code=response.status_code,
                    response_body=json.loads(json.dumps(response.data, cls=JSONEncoder)),
                )
            else:
                owned.delete()
        except DatabaseError as exc:
            # The work is done (or refused) and its answer is true: send it. The claim stays
            # without a response; after LEASE a retry runs the handler again, and the services'
            # own idempotency (a reservation's key, a commit's first result) answers it.
            logger.warning(
                "llm_budgets: could not record the response to %s %s for its Idempotency-Key: %s",
                request.method,
                request.path,
                exc,
            )
        return response

    return wrapper


def idempotency_records_clear(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete records older than ``older_than`` (like Django's ``clearsessions``): after that a
    retry with the same key runs again. Reservations stay protected by their own idempotency key.
    Returns how many were deleted."""
    cutoff = (now or timezone.now()) - older_than
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
