"""Escalation: the gateway hands a task to a person.

``escalate`` is the one way a task reaches the takeover desk: the gateway calls it when
a check refuses or a result stays in doubt. It lives apart from ``tasks.takeover`` (what
the person then does) so the imports run one way: the takeover desk uses the gateway to
execute a person's edit, and the gateway uses only this module to hand work over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from django.conf import settings

from audit import payloads
from audit import services as audit_services
from audit.models import EventCode
from audit.redaction import redact
from portal import db as portal_db
from portal.actors import Actor
from portal.codes import ReasonCode
from portal.models import Tenant
from portal.tracing import NO_TRACE, Trace
from routing import services as routing_services
from routing.models import ItemKind

from . import services
from .models import (
    OPERATION_TRANSITIONS,
    Escalation,
    Operation,
    OperationState,
    Task,
    TaskState,
)
from .task_state import TaskStateWrite, task_from_row, task_state_write

# Only automation's states: a task a person holds (or that ended) stays as it is.
_ESCALATE_MOVES: Final[dict[str, str]] = dict.fromkeys(
    services.LEASABLE_STATES, TaskState.HUMAN_REQUIRED
)
_ESCALATE: Final = TaskStateWrite(
    where="t.tenant_id = %(tenant_id)s AND t.id = %(task_id)s",
    assignments=(
        "reason_code = %(reason)s",
        "lease_owner = NULL",
        "lease_acquired_at = NULL",
        "lease_expires_at = NULL",
        "lease_token = t.lease_token + 1",
    ),
)


def escalate(
    *,
    tenant: Tenant,
    task: Task,
    operation: Operation | None,
    reason: ReasonCode,
    evidence: Mapping[str, Any],
    actor: Actor,
    trace: Trace = NO_TRACE,
) -> Escalation:
    """Hand a task to a person, in the caller's transaction.

    The operation (if it can) moves to ``human_required``; the task moves there too
    from pending, running or waiting, losing its automatic lease with a new fencing
    token, so the worker that held it can write nothing more. The evidence is stored
    redacted and bounded.

    Raises:
        TransactionRequired: called outside a transaction.
    """
    portal_db.require_transaction()
    if (
        operation is not None
        and (operation.state, OperationState.HUMAN_REQUIRED) in OPERATION_TRANSITIONS
    ):
        operation = services.operation_move(
            tenant=tenant,
            operation_id=operation.pk,
            to=OperationState.HUMAN_REQUIRED,
            expected_version=operation.state_version,
            actor=actor,
            trace=trace,
            reason=reason,
        )
    rows = task_state_write(
        statement=_ESCALATE,
        moves=_ESCALATE_MOVES,
        params={"reason": reason, "tenant_id": tenant.pk, "task_id": task.pk},
    )
    moved = task_from_row(rows[0]) if rows else None
    record = Escalation.objects.create(
        tenant=tenant,
        task_id=task.pk,
        operation=operation,
        reason_code=reason,
        evidence=redact(
            dict(evidence),
            tenant_id=tenant.pk,
            max_bytes=settings.PORTAL_EVENT_PAYLOAD_MAX_BYTES // 4,
        ),
        responsible_owner=task.lease_owner or actor.id,
    )
    audit_services.event_append(
        tenant_id=tenant.pk,
        code=EventCode.TASK_ESCALATED,
        actor=actor,
        task_id=task.pk,
        operation_id=operation.pk if operation else None,
        reason=reason,
        trace=trace,
        data=payloads.TaskEscalated(
            {
                "escalation_id": str(record.pk),
                "task_moved": moved is not None,
                "lease_token": moved.lease_token if moved else None,
                "evidence": record.evidence,
            }
        ),
    )
    # Who works it and by when; notifications commit with the escalation.
    routing_services.item_assign(
        tenant=tenant,
        item_kind=ItemKind.ESCALATION,
        item_id=record.pk,
        reason_code=reason,
        task_id=task.pk,
        actor=actor,
    )
    return record
