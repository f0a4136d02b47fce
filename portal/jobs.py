"""Celery jobs of the portal app (docs/style.md R10: thin, ids in, idempotent)."""

from __future__ import annotations

from celery import shared_task

from . import idempotency


@shared_task(acks_late=True, ignore_result=True)
def purge_idempotent_requests_job() -> int:
    """Delete Idempotency-Key records past their window; safe to run anywhere, often."""
    return idempotency.idempotent_requests_purge_expired()
