"""Reads of tasks, operations and contracts. Every selector requires ``tenant``."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from portal.models import Tenant

from .exceptions import ContractNotFound, OperationNotFound, TaskNotFound
from .models import Contract, ContractStatus, Operation, Task


def task_get(*, tenant: Tenant, task_id: uuid.UUID) -> Task:
    """The tenant's task.

    Raises:
        TaskNotFound: no such task in this tenant (another tenant's task too).
    """
    try:
        return Task.objects.get(tenant=tenant, pk=task_id)
    except (Task.DoesNotExist, ValueError):
        raise TaskNotFound(task_id=str(task_id)) from None


def task_list(*, tenant: Tenant, state: str | None = None) -> QuerySet[Task]:
    """The tenant's tasks, oldest first."""
    tasks = Task.objects.filter(tenant=tenant)
    if state is not None:
        tasks = tasks.filter(state=state)
    return tasks.order_by("created_at", "id")


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
