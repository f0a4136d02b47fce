"""Celery jobs of the audit app (docs/style.md R10: thin, one call, idempotent)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Final

from celery import shared_task
from celery.signals import worker_init

from . import broker, checkpoints, relay, retention

logger = logging.getLogger(__name__)
CHECKPOINT_TENANT_JOB_NAME: Final = "audit.jobs.checkpoint_tenant_job"


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=60, time_limit=75)
def relay_outbox_job() -> dict[str, Any]:
    """Publish due outbox rows until a batch comes back short or the budget is spent.

    Run by beat every few seconds and nudged after commits (``relay.nudge_relay``).
    Guarantee: safe to run on many workers at once and to repeat: rows are claimed
    with ``SKIP LOCKED`` and leased, and a row is marked sent only after the broker's
    confirm. A worker killed mid-batch leaves its rows leased; they are published
    again once the lease lapses (at least once). The time limits sit above the
    budget (``PORTAL_OUTBOX_RELAY_BUDGET_S``) plus one batch.
    """
    with broker.broker_publisher() as publisher:
        report = relay.outbox_relay_drain(publisher=publisher)
    return report.as_json()


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=50, time_limit=55)
def checkpoint_audit_job() -> dict[str, int]:
    """Sign every event chain head that moved since its last checkpoint.

    Run by beat every minute. Guarantee: safe to repeat and to overlap: one run per
    tenant at a time, and a run with nothing new writes nothing.
    """
    return checkpoints.unscoped_checkpoint_all()


@shared_task(
    name=CHECKPOINT_TENANT_JOB_NAME,
    acks_late=True,
    ignore_result=True,
    soft_time_limit=50,
    time_limit=55,
)
def checkpoint_tenant_job(*, tenant_id: str) -> int:
    """Sign every chain head of one tenant that moved since its last checkpoint.

    Sent by an evidence export in the web, which holds no signing key and waits for
    the checkpoint row (``audit.evidence``). Guarantee: the same run as
    ``checkpoint_audit_job``'s for that tenant; safe to repeat and to overlap.
    """
    return checkpoints.tenant_checkpoint_scoped(tenant_id=uuid.UUID(tenant_id))


@worker_init.connect(weak=False)
def _signer_ready(**_: Any) -> None:
    """Load the signing key as the worker starts: a missing or mismatched key is
    in the log at once, not a minute later; in development this writes the key
    and its public half under var/, which the web publishes."""
    try:
        key = checkpoints.signing_key()
    except Exception:
        logger.exception("this worker cannot sign audit checkpoints")
    else:
        logger.info("audit checkpoints are signed here with key %s", key.key_id)


@shared_task(acks_late=True, ignore_result=True)
def ensure_event_partitions_job() -> list[str]:
    """Create the coming months' partitions of audit_event; idempotent, often."""
    return retention.event_partitions_ensure()


@shared_task(acks_late=True, ignore_result=True, soft_time_limit=3000, time_limit=3600)
def apply_retention_job() -> dict[str, object]:
    """Remove expired events and payloads, drop expired partitions (daily).

    Guarantee: safe to repeat and to overlap: each tenant's purge waits for the
    other's, and a second run finds nothing left to remove.
    """
    return retention.unscoped_retention_run().as_json()


@shared_task(acks_late=True, ignore_result=True)
def purge_sent_outbox_job() -> int:
    """Delete delivered outbox rows past their window; idempotent, hourly."""
    return retention.outbox_sent_purge()
