"""Retention: delete what has no billing meaning once it is old enough.

Deleted: reservations that ended without a charge (released, or expired under the "release"
policy) more than ``RETENTION_RELEASED_DAYS`` ago, with their hold rows; refusal records older
than ``RETENTION_REFUSALS_DAYS``. Never deleted: ledger lines, and any reservation that a ledger
line refers to.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from llm_budgets.conf import conf
from llm_budgets.models import Refusal, Reservation, ReservationState


def reservations_purge(*, now: datetime | None = None, batch_size: int = 1000) -> int:
    """Delete uncharged reservations settled before the retention cutoff. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=conf.RETENTION_RELEASED_DAYS)
    purged = 0
    while True:
        with transaction.atomic():
            batch = list(
                Reservation.objects.filter(
                    state__in=(ReservationState.RELEASED, ReservationState.EXPIRED),
                    settled_at__lt=cutoff,
                    usage_records__isnull=True,
                ).values_list("pk", flat=True)[:batch_size]
            )
            # Re-check in the delete: a late commit may have charged one meanwhile (and the
            # foreign key from ledger lines refuses the delete of a charged one regardless).
            _, by_model = Reservation.objects.filter(
                pk__in=batch, usage_records__isnull=True
            ).delete()
        purged += by_model.get(Reservation._meta.label, 0)
        if len(batch) < batch_size:
            return purged


def refusals_purge(*, now: datetime | None = None, batch_size: int = 5000) -> int:
    """Delete refusal records older than ``RETENTION_REFUSALS_DAYS``. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=conf.RETENTION_REFUSALS_DAYS)
    purged = 0
    while True:
        batch = list(
            Refusal.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:batch_size]
        )
        purged += Refusal.objects.filter(pk__in=batch).delete()[0]
        if len(batch) < batch_size:
            return purged
