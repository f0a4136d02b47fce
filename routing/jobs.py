"""Routing's Celery jobs: thin, idempotent, across the tenants that have work.

Jobs sit above tasks (they are called by nothing in it), so the SLA job may call the
approvals service that records expiry.
"""

from __future__ import annotations

from celery import shared_task

from tasks import approvals

from . import delivery, services


@shared_task(acks_late=True, ignore_result=True)
def deliver_notifications_job(*, limit: int = 50) -> dict[str, int]:
    """Send one batch of due e-mails and webhook posts; safe on many workers."""
    return delivery.notifications_deliver_once(limit=limit)


@shared_task(acks_late=True, ignore_result=True)
def sweep_sla_job(*, limit: int = 200) -> tuple[int, int]:
    """Expire approvals past their window, then remind and escalate desk items past
    their SLA; (reminded, escalated).

    Expiry first, so the sweep closes an expired approval's item instead of
    reminding its group.
    """
    approvals.approvals_expire_overdue()
    return services.sla_sweep(limit=limit)
