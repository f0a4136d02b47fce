"""Execute an operation now, or authorise it now and hand the call to a worker.

What the execute endpoint asks of the gateway, out of the view (docs/style.md R11):
whether the caller wants an asynchronous answer, the gateway's execute, and the nudge
that starts a queued run on a Celery worker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from portal.actors import Actor
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace

from . import gateway, jobs

logger = logging.getLogger(__name__)

RESPOND_ASYNC = "respond-async"


def prefers_respond_async(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header value (RFC 7240) asks for ``respond-async``.

    Matched anywhere in the value, case-insensitively; a missing header is no.
    """
    return RESPOND_ASYNC in (prefer or "").lower()


def operation_dispatch(
    *,
    tenant: Tenant,
    operation_id: uuid.UUID,
    lease_token: int,
    fields: Sequence[gateway.FieldValue],
    actor: Actor,
    trace: Trace = NO_TRACE,
    respond_async: bool = False,
) -> gateway.GatewayResult:
    """Execute through the gateway; with ``respond_async``, queue the call instead.

    Without ``respond_async`` this is ``gateway.operation_execute``: checks, one call,
    the recorded outcome. With it the gateway runs its checks now (their verdict
    commits) and answers ``queued``; then a worker is nudged to make the call.

    Guarantee: a queued operation is pending work in the database before the nudge;
    a broker that is down only delays it (the settle job starts the call later), so
    no broker error reaches the caller.

    Raises:
        Whatever ``gateway.operation_execute`` raises (not found, lease expired, …);
        a refusal is not raised but returned as outcome ``refused``.
    """
    result = gateway.operation_execute(
        queue=respond_async,
        tenant=tenant,
        operation_id=operation_id,
        lease_token=lease_token,
        actor=actor,
        trace=trace,
        fields=fields,
    )
    if result.outcome == "queued":
        operation_run_enqueue(tenant_id=tenant.pk, operation_id=result.operation.pk)
    return result


def operation_run_enqueue(*, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> None:
    """Nudge a worker to run a queued operation; never raises for the broker.

    If the broker is down the authorisation is still committed: the settle job
    starts the call after a grace period.
    """
    try:
        jobs.run_operation_job.delay(
            tenant_id=str(tenant_id), operation_id=str(operation_id)
        )
    except Exception:  # the database, not the broker, holds the pending work
        logger.warning(
            "could not enqueue operation %s; the settle job will run it",
            operation_id,
            exc_info=True,
        )
