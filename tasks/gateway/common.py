"""What every step of the gateway shares: the lock order, the clock, the evidence.

``lock`` is the one lock order of the app (task row, then operation row); every
step that writes an operation takes it first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

from django.db import connection

from portal import db as portal_db
from portal.actors import Actor
from portal.models import Tenant

from ..models import Operation, Task
from ..services.operations import OPERATION_COLUMNS, operation_from_row
from ..task_state import TASK_COLUMNS, task_from_row

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
    params = {"tenant_id": tenant.pk, "operation_id": operation_id}
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_TASK, params)
        task_row = cursor.fetchone()
        if task_row is None:
            return None
        cursor.execute(_LOCK_OPERATION_SKIP if skip_locked else _LOCK_OPERATION, params)
        operation_row = cursor.fetchone()
    if operation_row is None:
        return None
    return task_from_row(task_row), operation_from_row(operation_row)


# ``lock``'s two statements, hand-written: the gateway takes the lock three times
# per action, and the ORM's three queries (the operation's task id, then each row)
# cost more Python than the database's work. The operation's task id never
# changes, so the task is found and locked in one statement.
_LOCK_TASK: Final = f"""
SELECT {TASK_COLUMNS} FROM tasks_task AS t
WHERE t.tenant_id = %(tenant_id)s AND t.id = (
    SELECT o.task_id FROM tasks_operation AS o
    WHERE o.tenant_id = %(tenant_id)s AND o.id = %(operation_id)s
)
FOR UPDATE OF t
"""
_LOCK_OPERATION: Final = f"""
SELECT {OPERATION_COLUMNS} FROM tasks_operation AS o
WHERE o.tenant_id = %(tenant_id)s AND o.id = %(operation_id)s
FOR UPDATE OF o
"""
_LOCK_OPERATION_SKIP: Final = f"{_LOCK_OPERATION.rstrip()} SKIP LOCKED\n"


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
