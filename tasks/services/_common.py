"""What the task and operation writes share: a one-row read, and the reason a
guarded task write touched no row.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connection

from portal.exceptions import (
    IllegalTransition,
    LeaseExpired,
    StaleState,
)

from ..exceptions import (
    TaskNotFound,
)


def _fetch(sql: str, params: Mapping[str, Any] | list[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _task_refusal(
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    lease_token: int | None,
    expected_version: int | None = None,
    to: str | None = None,
) -> Exception:
    """Why a guarded task write touched no row: reload and name the reason."""
    row = _fetch(
        """
        SELECT state, state_version, lease_token,
               lease_owner IS NOT NULL AND lease_expires_at > app_now()
        FROM tasks_task WHERE tenant_id = %s AND id = %s
        """,
        [tenant_id, task_id],
    )
    if row is None:
        return TaskNotFound(task_id=str(task_id))
    state, state_version, current_token, lease_live = row
    # A newer token means another holder took over: fenced out, whatever else changed.
    if lease_token is not None and current_token != lease_token:
        return LeaseExpired(task_id=str(task_id), lease_token=lease_token)
    # Same token but a newer version: a duplicate of this writer got there first (its
    # move may also have handed the lease back). Reload, never overwrite.
    if expected_version is not None and state_version != expected_version:
        return StaleState(
            task_id=str(task_id),
            expected_state_version=expected_version,
            state_version=state_version,
        )
    if lease_token is not None and not lease_live:
        return LeaseExpired(task_id=str(task_id), lease_token=lease_token)
    return IllegalTransition(task_id=str(task_id), current=state, requested=to)
