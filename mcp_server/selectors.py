"""The MCP server's reads: an agent's grants, and what an agent owns (R3: tenant
first; another agent's or another tenant's row is "not found", as on the REST API).
"""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet

from portal.models import Agent, AgentGrant, Tenant
from tasks.exceptions import TaskNotFound
from tasks.models import Escalation, Operation, Task

from .exceptions import DeskItemNotFound


def grant_list(*, tenant: Tenant, agent: Agent) -> QuerySet[AgentGrant]:
    """The agent's grants, by action then target."""
    return AgentGrant.objects.filter(tenant=tenant, agent=agent).order_by(
        "action", "target"
    )


def _owned_operations(*, tenant: Tenant, agent: Agent) -> QuerySet[Operation]:
    # The agent reserved it, or executed it under its own grant.
    return Operation.objects.filter(tenant=tenant).filter(
        Q(agent=agent) | Q(executed_by_agent=agent)
    )


def task_get_for_agent(*, tenant: Tenant, agent: Agent, task_id: uuid.UUID) -> Task:
    """A task one of whose operations the agent reserved or executed.

    Raises:
        TaskNotFound: no such task, or none of its operations is the agent's.
    """
    owned = _owned_operations(tenant=tenant, agent=agent).filter(task_id=task_id)
    task = Task.objects.filter(tenant=tenant, pk=task_id).filter(
        pk__in=owned.values("task_id")
    )
    found = task.first()
    if found is None:
        raise TaskNotFound(task_id=str(task_id))
    return found


def desk_item_get_for_agent(
    *, tenant: Tenant, agent: Agent, item_id: uuid.UUID
) -> Escalation:
    """A desk item (escalation) on a task the agent owns (``task_get_for_agent``).

    Raises:
        DeskItemNotFound: no such item, or its task is not the agent's.
    """
    item = (
        Escalation.objects.filter(tenant=tenant, pk=item_id)
        .select_related("task", "operation")
        .first()
    )
    if item is None:
        raise DeskItemNotFound(desk_item_id=str(item_id))
    try:
        task_get_for_agent(tenant=tenant, agent=agent, task_id=item.task_id)
    except TaskNotFound:
        raise DeskItemNotFound(desk_item_id=str(item_id)) from None
    return item
