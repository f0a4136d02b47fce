"""What every step of the gateway shares: the lock order, the clock, the evidence.

``lock`` is the one lock order of the app (task row, then operation row); every
step that writes an operation takes it first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

from portal import db as portal_db
from portal.actors import Actor
from portal.models import Tenant

from ..models import Operation, Task

TestHook = Callable[[str], None]

SYSTEM: Final = Actor.system("gateway")


def no_hook(point: str) -> None:
    """The default ``_test_hook``: named fault points do nothing outside tests."""
    return None


def lock(
    *, tenant: Tenant, operation_id: uuid.UUID, skip_locked: bool = False
) -> tuple[Task, Operation] | None:
    """Lock an operation's task, then the operation: the one lock order of the app.

    Every writer takes the task row before the operation row (the lease checks in
    services read the task FOR SHARE first too), so two of them can never deadlock.
    With ``skip_locked``, a busy operation returns None instead of waiting.
    """
    portal_db.require_transaction()
    task_id = (
        Operation.objects.filter(tenant=tenant, pk=operation_id)
        .values_list("task_id", flat=True)
        .first()
    )
    if task_id is None:
        return None
    task = Task.objects.select_for_update(of=("self",)).get(tenant=tenant, pk=task_id)
    operation = (
        Operation.objects.select_for_update(of=("self",), skip_locked=skip_locked)
        .filter(tenant=tenant, pk=operation_id)
        .first()
    )
    return (task, operation) if operation is not None else None


def plan(operation: Operation, task: Task) -> dict[str, Any]:
    """The agent's proposal, as evidence: what it wanted to do to which object."""
    return {
        "action": operation.action,
        "target": operation.target,
        "idempotency_key": operation.idempotency_key,
        "input_hash": operation.input_hash,
        "object": {
            "type": task.object_type,
            "id": task.object_id,
            "version_read": task.object_version,
        },
        "contract": {"key": task.contract_key, "version": task.contract_version},
    }
