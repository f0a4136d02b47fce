"""Celery jobs of the task domain (STYLE.md R10: thin, ids in, idempotent)."""

from __future__ import annotations

import logging

from celery import shared_task

from portal import selectors as portal_selectors

from . import gateway, services

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True)
def check_receipts_job(*, limit: int = 100) -> int:
    """Run the recovery protocol on operations whose look is due; safe on many workers.

    Each operation is claimed with SKIP LOCKED inside ``operation_recover``, so two
    workers never look at the same one at once. Returns how many were looked at.
    """
    looked = 0
    for tenant_id, operation_id in gateway.unscoped_operations_due(limit=limit):
        tenant = portal_selectors.tenant_get(tenant_id=tenant_id)
        try:
            gateway.operation_recover(tenant=tenant, operation_id=operation_id)
        except Exception:  # one bad operation must not stop the others
            logger.exception("recovery of operation %s failed", operation_id)
            continue
        looked += 1
    return looked


@shared_task(acks_late=True, ignore_result=True)
def reap_leases_job() -> int:
    """Take back lapsed leases, batch by batch, until none is left (or 10 batches)."""
    total = 0
    for _ in range(10):
        reaped = services.unscoped_leases_reap()
        total += reaped
        if reaped < 200:
            break
    return total


@shared_task(acks_late=True, ignore_result=True)
def wake_tasks_job() -> int:
    """Wake waiting tasks whose time has come, batch by batch (at most 10 batches)."""
    total = 0
    for _ in range(10):
        woken = services.unscoped_waiting_tasks_wake()
        total += woken
        if woken < 200:
            break
    return total
