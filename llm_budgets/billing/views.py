"""``POST /api/llm-budgets/v1/stripe/webhook``: no API key; Stripe's signature authenticates."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from llm_budgets.billing.webhooks import (
    WebhookSignatureError,
    error_text,
    webhook_receive,
    webhook_verify,
)
from llm_budgets.models import WebhookEventState


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    """400 before storing anything when the signature does not verify; 200 once processed (or
    already processed), and 200 for a signed event this app cannot read (stored unprocessable
    with the reason: Stripe would retry it for days); 500 with the error when processing failed
    (stored; Stripe retries)."""
    payload = request.body
    try:
        webhook_verify(payload=payload, signature=request.headers.get("Stripe-Signature"))
    except WebhookSignatureError as exc:
        return JsonResponse(
            {"error": {"code": "invalid_signature", "detail": exc.message}}, status=400
        )
    try:
        row = webhook_receive(payload=payload)
    except Exception as exc:  # stored on the event row; Stripe retries on 5xx
        return JsonResponse(
            {"error": {"code": "processing_failed", "detail": error_text(exc)}}, status=500
        )
    answer = {"received": row.id, "state": row.state, "outcome": row.outcome}
    if row.state == WebhookEventState.UNPROCESSABLE:
        answer["reason"] = row.error
    return JsonResponse(answer)
