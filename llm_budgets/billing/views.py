"""``POST /api/llm-budgets/v1/stripe/webhook``: no API key; Stripe's signature authenticates."""

from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from llm_budgets.billing.webhooks import (
    WebhookPayloadError,
    WebhookSignatureError,
    error_text,
    webhook_receive,
    webhook_verify,
)

logger = logging.getLogger(__name__)


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    """400 before storing anything when the signature does not verify or the signed payload is
    not a Stripe event's shape (logged); 200 once processed (or already processed); 500 with the
    error when processing failed (stored; Stripe retries)."""
    payload = request.body
    try:
        event = webhook_verify(payload=payload, signature=request.headers.get("Stripe-Signature"))
    except WebhookSignatureError as exc:
        return JsonResponse(
            {"error": {"code": "invalid_signature", "detail": exc.message}}, status=400
        )
    except WebhookPayloadError as exc:
        logger.warning("Stripe webhook refused (signed, stored nothing): %s", exc.message)
        return JsonResponse(
            {"error": {"code": "invalid_payload", "detail": exc.message}}, status=400
        )
    try:
        row = webhook_receive(payload=payload, event=event)
    except Exception as exc:  # stored on the event row; Stripe retries on 5xx
        return JsonResponse(
            {"error": {"code": "processing_failed", "detail": error_text(exc)}}, status=500
        )
    return JsonResponse({"received": row.id, "outcome": row.outcome})
