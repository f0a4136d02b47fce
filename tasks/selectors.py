"""Reads of tasks, operations and contracts. Every selector requires ``tenant``,
except the ``unscoped_`` monitoring counts at the end."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Final

from django.db import connection
from django.db.models import QuerySet

from portal.models import Tenant

from .exceptions import (
    ContractNotFound,
    ObjectVersionNotFound,
    OperationNotFound,
    TaskNotFound,
)
from .models import (
    Contract,
    ContractStatus,
    ObjectVersion,
    Operation,
    Task,
    TaskState,
)


def task_get(*, tenant: Tenant, task_id: uuid.UUID) -> Task:
    """The tenant's task.

    Raises:
        TaskNotFound: no such task in this tenant (another tenant's task too).
    """
    try:
        return Task.objects.get(tenant=tenant, pk=task_id)
    except (Task.DoesNotExist, ValueError):
        raise TaskNotFound(task_id=str(task_id)) from None


def task_list(
    *,
    tenant: Tenant,
    state: str | None = None,
    object_type: str | None = None,
    object_id: str | None = None,
    trace_id: str | None = None,
    updated_since: dt.datetime | None = None,
) -> QuerySet[Task]:
    """The tenant's tasks, oldest first (ids are time-ordered), optionally filtered."""
    tasks = Task.objects.filter(tenant=tenant)
    filters: dict[str, object] = {
        "state": state,
        "object_type": object_type,
        "object_id": object_id,
        "trace_id": trace_id,
        "updated_at__gte": updated_since,
    }
    tasks = tasks.filter(**{k: v for k, v in filters.items() if v is not None})
    return tasks.order_by("id")


def operation_get(*, tenant: Tenant, operation_id: uuid.UUID) -> Operation:
    """The tenant's operation.

    Raises:
        OperationNotFound: no such operation in this tenant.
    """
    try:
        return Operation.objects.get(tenant=tenant, pk=operation_id)
    except (Operation.DoesNotExist, ValueError):
        raise OperationNotFound(operation_id=str(operation_id)) from None


def operation_get_by_key(*, tenant: Tenant, idempotency_key: str) -> Operation | None:
    return Operation.objects.filter(
        tenant=tenant, idempotency_key=idempotency_key
    ).first()


def contract_get(*, tenant: Tenant, key: str, version: int) -> Contract:
    """A contract version of the tenant, in any status.

    Raises:
        ContractNotFound: no such version.
    """
    try:
        return Contract.objects.get(tenant=tenant, key=key, version=version)
    except Contract.DoesNotExist:
        raise ContractNotFound(key=key, version=version) from None


def contract_latest_published(*, tenant: Tenant, key: str) -> Contract:
    """The newest published (not retired) version of a contract.

    Raises:
        ContractNotFound: no published version.
    """
    contract = (
        Contract.objects.filter(tenant=tenant, key=key, status=ContractStatus.PUBLISHED)
        .order_by("-version")
        .first()
    )
    if contract is None:
        raise ContractNotFound(key=key)
    return contract


def object_version_get(
    *, tenant: Tenant, object_type: str, object_id: str
) -> ObjectVersion:
    """The recorded current version of a business object.

    Raises:
        ObjectVersionNotFound: nothing recorded for this object.
    """
    try:
        return ObjectVersion.objects.get(
            tenant=tenant, object_type=object_type, object_id=object_id
        )
    except ObjectVersion.DoesNotExist:
        raise ObjectVersionNotFound(
            object_type=object_type, object_id=object_id
        ) from None


def contract_list(*, tenant: Tenant, key: str | None = None) -> QuerySet[Contract]:
    """The tenant's contract versions, by key then version."""
    contracts = Contract.objects.filter(tenant=tenant)
    if key is not None:
        contracts = contracts.filter(key=key)
    return contracts.order_by("key", "version")


# --- Monitoring, across tenants (docs/observability.md, "Metrics") ------------------
# Read by /metrics when it is scraped (config/metrics_views.py); each is one cheap
# statement. They read ``tasks_task`` across tenants: once that table has row-level
# security, each becomes a call to a SECURITY DEFINER function returning the same
# aggregate (docs/database-roles.md).

OPEN_TASK_STATES: Final = (
    TaskState.PENDING,
    TaskState.RUNNING,
    TaskState.WAITING,
    TaskState.HUMAN_REQUIRED,
    TaskState.HUMAN_CLAIMED,
)

_OPEN_TASK_COUNTS: Final = """
SELECT state, coalesce(reason_code, ''), count(*)
FROM tasks_task
WHERE state = ANY(%s)
GROUP BY 1, 2
"""

_TAKEOVER_QUEUE: Final = """
SELECT state, count(*), EXTRACT(EPOCH FROM app_now() - min(updated_at))
FROM tasks_task
WHERE state IN ('human_required', 'human_claimed')
GROUP BY 1
"""


@dataclass(frozen=True, kw_only=True)
class TakeoverQueueStats:
    # Tasks per state (human_required: waiting for a person; human_claimed: taken).
    size: dict[str, int]
    # Seconds since the longest-waiting task of each state last changed.
    oldest_age_s: dict[str, float]


def open_task_counts() -> list[tuple[str, str, int]]:
    """Unfinished tasks of the tenants in scope by (state, reason code or '') and
    count."""
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_TASK_COUNTS, [list(OPEN_TASK_STATES)])
        return [(state, reason, int(count)) for state, reason, count in cursor]


def takeover_queue_stats() -> TakeoverQueueStats:
    """The takeover queue of the tenants in scope: its size and its oldest task's
    age."""
    with connection.cursor() as cursor:
        cursor.execute(_TAKEOVER_QUEUE)
        rows = cursor.fetchall()
    return TakeoverQueueStats(
        size={state: int(count) for state, count, _ in rows},
        oldest_age_s={state: float(age) for state, _, age in rows},
    )
