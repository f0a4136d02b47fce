"""Celery jobs of the task domain (docs/style.md R10: thin, ids in, idempotent)."""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from django.db import InterfaceError, OperationalError

from portal import scope
from portal import selectors as portal_selectors

from . import gateway, services
from .exceptions import ConnectorKeyUnsealable, SealedValuesUnsealable
from .sealed import unsealable_log

logger = logging.getLogger(__name__)


# While the database is down every run fails at once; acking those would drain the
# queue into serial settle-job work (found by tests/fault). Retrying is safe: a
# repeated run finds the operation no longer reserved and does nothing.
@shared_task(
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=10,
)
def run_operation_job(*, tenant_id: str, operation_id: str) -> None:
    """Make the call of a queued execution; redelivery-safe (operation_run_queued)."""
    with scope.tenant_scope([tenant_id]):  # row-level security: this tenant
        tenant = portal_selectors.tenant_get(tenant_id=tenant_id)
        gateway.operation_run_queued(
            tenant=tenant, operation_id=uuid.UUID(operation_id)
        )


@shared_task(acks_late=True, ignore_result=True)
def check_receipts_job(*, limit: int = 100) -> int:
    """Settle operations whose look is due; safe on many workers at once.

    In doubt (executing past its deadline, or unknown): the recovery protocol.
    Queued but never started (its message was lost): run it now. Each operation is
    claimed with SKIP LOCKED inside the gateway, so two workers never act on the same
    one at once. Returns how many were looked at.
    """
    looked = 0
    for tenant_id, operation_id, state in gateway.unscoped_operations_due(limit=limit):
        tenant = portal_selectors.tenant_get(tenant_id=tenant_id)
        settle = (
            gateway.operation_run_queued
            if state == "reserved"
            else gateway.operation_recover
        )
        try:
            with scope.tenant_scope([tenant_id]):  # each settles in its own tenant
                settle(tenant=tenant, operation_id=operation_id)
        except (ConnectorKeyUnsealable, SealedValuesUnsealable) as error:
            # Configuration, not this operation: said once, no traceback.
            unsealable_log(error)
            continue
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
